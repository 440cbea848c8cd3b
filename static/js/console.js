// A region request htmx did not swap (403, 404, 500, network down) would
// otherwise fail silently: say so where flash notices appear.
(function () {
  function notice(text) {
    var box = document.getElementById("messages");
    if (!box) return;
    var p = document.createElement("p");
    p.className = "flash flash-error";
    p.textContent = text;
    box.replaceChildren(p);
  }
  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    notice("Request failed: " + xhr.status + " " + (xhr.statusText || "") +
      (xhr.status === 403 ? " (only the endpoint's owners may do that)" : ""));
  });
  document.addEventListener("htmx:sendError", function () {
    notice("The console could not reach the server; the page shows what it last knew.");
  });
})();
