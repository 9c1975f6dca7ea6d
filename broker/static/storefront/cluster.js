// One cluster's page: while the cluster is not final, fetches the page itself every EVERY_MS and redraws its
// state, reason, summary and node tables from the fresh copy, as the server renders them; stops once final.
(function () {
  "use strict";
  var root = document.getElementById("cluster-live");
  if (!root || !root.hasAttribute("data-live")) {
    return;
  }
  var EVERY_MS = 5000;
  var PARTS = ["cluster-state", "cluster-reason", "cluster-summary", "cluster-nodes-wrap", "cluster-earlier-wrap"];
  var timer = null;

  function redraw() {
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (answer) {
        return answer.ok ? answer.text() : null;
      })
      .then(function (html) {
        if (!html) {
          return;
        }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        PARTS.forEach(function (id) {
          var now = document.getElementById(id);
          var then = fresh.getElementById(id);
          if (now && then) {
            now.replaceWith(document.importNode(then, true));
          }
        });
        var note = document.getElementById("cluster-live-note");
        if (note) {
          note.textContent = "live · updated " + new Date().toISOString().slice(11, 19) + " UTC";
        }
        var freshRoot = fresh.getElementById("cluster-live");
        if (!freshRoot || !freshRoot.hasAttribute("data-live")) {
          window.clearInterval(timer);
          var terminate = document.getElementById("terminate-form");
          if (terminate) {
            terminate.remove();
          }
          if (note) {
            note.textContent = "final";
          }
        }
      })
      .catch(function () {
        // A missed poll is retried at the next tick.
      });
  }

  timer = window.setInterval(redraw, EVERY_MS);
})();
