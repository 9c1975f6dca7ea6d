// One order's page: keeps state, cost and the instance's address current by polling the orders API
// (GET /api/v1/orders/<id>, the session signs it in) until the order reaches a final state, and every
// REFRESH_MS redraws the GPU telemetry and the ledger history from the page itself, as the server renders them.
(function () {
  "use strict";
  var root = document.getElementById("order-live");
  var url = root && root.getAttribute("data-api");
  if (!url) {
    return;
  }
  var FINAL = ["terminated", "failed", "cancelled"];
  var EVERY_MS = 3000;
  var REFRESH_MS = 10000;
  var timer = null;
  var refresher = null;
  var PARTS = ["telemetry", "history"]; // ids of the page's parts redrawn from a fresh copy of the page

  function text(id, value) {
    var node = document.getElementById(id);
    if (node && value !== null && value !== undefined) {
      node.textContent = value;
    }
  }

  function show(order) {
    var state = document.getElementById("order-state");
    if (state) {
      state.textContent = order.state;
      state.className = "state order-state " + order.state;
    }
    text("order-reason", order.state_reason);
    text("order-cost", "$" + Number(order.usage.amount_usd).toFixed(2));
    text("order-seconds", String(order.usage.seconds));
    if (order.instance) {
      text("instance-state", order.instance.state);
      if (order.instance.public_ip) {
        text("instance-ip", order.instance.public_ip);
      }
    }
    var now = new Date();
    text("live-note", "live · updated " + now.toISOString().slice(11, 19) + " UTC");
    if (FINAL.indexOf(order.state) >= 0) {
      var terminate = document.getElementById("terminate-form");
      if (terminate) {
        terminate.remove();
      }
      text("live-note", "final · reload for the invoice");
      window.clearInterval(timer);
      window.clearInterval(refresher);
      refresh();
    }
  }

  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        PARTS.forEach(function (id) {
          var now = document.getElementById(id);
          var next = fresh.getElementById(id);
          if (now && next) {
            now.replaceWith(document.importNode(next, true));
          }
        });
      })
      .catch(function () {
        // The state poll says when the broker cannot be reached; the charts simply wait for the next round.
      });
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(show)
      .catch(function () {
        text("live-note", "live updates paused, retrying");
      });
  }

  timer = window.setInterval(poll, EVERY_MS);
  refresher = window.setInterval(refresh, REFRESH_MS);
})();
