// tidings dashboard: live refresh of the page's main region, and confirmations.
// No external assets; the page works without this file (it only refreshes and confirms).
(function () {
  "use strict";
  var EVERY_MS = 5000;
  function editing() {
    var el = document.activeElement;
    return el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.tagName === "SELECT");
  }
  function refresh() {
    var box = document.getElementById("live");
    if (!box || !box.checked || editing() || document.hidden) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) main.replaceChildren.apply(main, Array.from(fresh.childNodes));
      })
      .catch(function () {});
  }
  document.addEventListener("submit", function (ev) {
    var btn = ev.submitter;
    var text = btn && btn.getAttribute("data-confirm");
    if (text && !window.confirm(text)) ev.preventDefault();
  });
  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("live");
    if (box) box.checked = window.localStorage.getItem("tidings-live") !== "off";
    if (box) box.addEventListener("change", function () {
      window.localStorage.setItem("tidings-live", box.checked ? "on" : "off");
    });
    window.setInterval(refresh, EVERY_MS);
  });
})();
