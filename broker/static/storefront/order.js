// One order's page: keeps state, cost and the instance's address current by polling the orders API
// (GET /api/v1/orders/<id>, the session signs it in) until the order reaches a final state, and every
// REFRESH_MS (and at once when the state changes) redraws the machine's boot and connection, the GPU telemetry
// and the ledger history from the page itself, as the server renders them. Copy buttons copy a node's text.
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
  var PARTS = ["order-actions", "order-stopped-note", "machine", "instances", "telemetry", "logs", "history"]; // ids of the page's parts redrawn from a fresh copy of the page
  var lastState = root.getAttribute("data-state");

  function text(id, value) {
    var node = document.getElementById(id);
    if (node && value !== null && value !== undefined) {
      node.textContent = value;
    }
  }

  // The API's amount is already rounded by the broker's one money rule ("1234.56"): group it and name the
  // currency as the server-rendered page does ("1,234.56 USD"), never re-rounding it in floating point.
  function money(amount) {
    var parts = String(amount).split(".");
    parts[0] = parts[0].replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    return parts.join(".") + " USD";
  }

  function show(order) {
    var state = document.getElementById("order-state");
    if (state) {
      state.textContent = order.state;
      state.className = "state order-state " + order.state;
    }
    text("order-reason", order.state_reason);
    text("order-cost", money(order.usage.amount_usd));
    text("terminate-cost", money(order.usage.amount_usd));
    text("terminate-seconds", String(order.usage.seconds));
    text("order-seconds", String(order.usage.seconds));
    if (order.instance) {
      text("instance-state", order.instance.state);
      if (order.instance.public_ip) {
        text("instance-ip", order.instance.public_ip);
      }
    }
    var now = new Date();
    text("live-note", "live · updated " + now.toISOString().slice(11, 19) + " UTC");
    var changed = order.state !== lastState;
    lastState = order.state;
    if (FINAL.indexOf(order.state) < 0 && changed) {
      refresh(); // became ready (or went back to provisioning): show how to connect, or why not, right away
    }
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

  function copy(event) {
    var button = event.target.closest("button.copy");
    var source = button && document.getElementById(button.getAttribute("data-copy"));
    if (!source) {
      return;
    }
    var value = source.textContent.trim();
    function done() {
      button.textContent = "Copied";
      window.setTimeout(function () {
        button.textContent = "Copy";
      }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(value).then(done, function () {
        button.textContent = "Select and copy";
      });
      return;
    }
    // Without the clipboard API (a plain-http page), select the text for the usual copy keys.
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    button.textContent = "Selected: press Ctrl+C";
  }

  // Delegated: the machine part, where the buttons are, is replaced on every refresh.
  document.addEventListener("click", copy);
  timer = window.setInterval(poll, EVERY_MS);
  refresher = window.setInterval(refresh, REFRESH_MS);
})();
