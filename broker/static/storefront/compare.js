// The offers page's "Compare selected" button: counts the ticked offers and is enabled for 2 to 6.
// Without this script the button always submits and the comparison page explains a wrong choice.
(function () {
  "use strict";
  var form = document.getElementById("compare-form");
  var button = document.getElementById("compare-button");
  var hint = document.getElementById("compare-hint");
  if (!form || !button) {
    return;
  }
  var boxes = document.querySelectorAll('input[type=checkbox][form="compare-form"]');

  function update() {
    var ticked = 0;
    boxes.forEach(function (box) {
      if (box.checked) {
        ticked += 1;
      }
    });
    button.disabled = ticked < 2 || ticked > 6;
    button.textContent = ticked ? "Compare selected (" + ticked + ")" : "Compare selected";
    if (hint) {
      hint.textContent = ticked > 6 ? "at most 6 offers" : "tick 2 to 6 offers";
    }
  }

  boxes.forEach(function (box) {
    box.addEventListener("change", update);
  });
  update();
})();
