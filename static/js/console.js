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

// Live refresh (issue 13): a poll never discards a form in progress, can be
// paused (remembered in localStorage), and the top bar says when the page
// last heard from the server. A poll is a request from an element whose
// hx-trigger is "every Ns"; anything the user asked for swaps as usual.
(function () {
  var KEY = "claimcheck.liveRefresh";
  var saved = {}; // region id -> dirty controls and focus, between beforeSwap and afterSwap

  function isPaused() {
    try { return window.localStorage.getItem(KEY) === "paused"; } catch (e) { return false; }
  }
  function setPaused(paused) {
    try { window.localStorage.setItem(KEY, paused ? "paused" : "on"); } catch (e) { /* private mode */ }
    showToggle();
    document.dispatchEvent(new CustomEvent("claimcheck:live"));
  }
  function showToggle() {
    var button = document.getElementById("live-toggle");
    if (!button) return;
    var paused = isPaused();
    button.setAttribute("aria-pressed", paused ? "false" : "true");
    button.textContent = paused ? "Live refresh: paused" : "Live refresh: on";
  }
  function stamp() {
    var at = document.getElementById("live-updated-at");
    if (!at) return;
    var now = new Date().toISOString();
    at.setAttribute("datetime", now);
    at.textContent = now.slice(11, 19) + "Z";
  }
  function isPoll(elt) {
    var trigger = elt && elt.getAttribute && elt.getAttribute("hx-trigger");
    return !!trigger && /(^|,)\s*every\s/.test(trigger);
  }

  function isDirty(el) {
    if (el.type === "checkbox" || el.type === "radio") return el.checked !== el.defaultChecked;
    if (el.tagName === "SELECT") {
      for (var i = 0; i < el.options.length; i++) {
        if (el.options[i].selected !== el.options[i].defaultSelected) return true;
      }
      return false;
    }
    if (/^(hidden|submit|button|reset|image|file)$/.test(el.type)) return false;
    return el.value !== el.defaultValue;
  }
  function selectorFor(el) {
    if (el.id) return "#" + CSS.escape(el.id);
    if (!el.name) return null;
    var s = el.tagName.toLowerCase() + '[name="' + CSS.escape(el.name) + '"]';
    if (el.type === "checkbox" || el.type === "radio") s += '[value="' + CSS.escape(el.value) + '"]';
    return s;
  }
  function capture(region) {
    var controls = [];
    region.querySelectorAll("input, textarea, select").forEach(function (el) {
      var selector = selectorFor(el);
      if (!selector || !isDirty(el)) return;
      var item = { selector: selector, type: el.type, value: el.value, checked: el.checked };
      if (el.tagName === "SELECT") {
        item.selected = Array.prototype.filter.call(el.options, function (o) { return o.selected; })
          .map(function (o) { return o.value; });
      }
      controls.push(item);
    });
    var focus = null, active = document.activeElement;
    if (active && region.contains(active) && selectorFor(active)) {
      focus = { selector: selectorFor(active), start: null, end: null };
      try { focus.start = active.selectionStart; focus.end = active.selectionEnd; } catch (e) { /* not text */ }
    }
    return { controls: controls, focus: focus };
  }
  function restore(region, state) {
    state.controls.forEach(function (item) {
      var el = region.querySelector(item.selector);
      if (!el) return;
      if (item.type === "checkbox" || item.type === "radio") el.checked = item.checked;
      else if (item.selected) Array.prototype.forEach.call(el.options, function (o) { o.selected = item.selected.indexOf(o.value) >= 0; });
      else el.value = item.value;
    });
    if (state.focus) {
      var el = region.querySelector(state.focus.selector);
      if (el) {
        el.focus({ preventScroll: true });
        try { if (state.focus.start !== null) el.setSelectionRange(state.focus.start, state.focus.end); } catch (e) { /* not text */ }
      }
    }
  }
  function hold(region, held) {
    region.classList.toggle("held", held);
    var note = document.getElementById("live-updated");
    if (note) note.dataset.held = held ? "true" : "";
  }

  // beforeRequest names the element that asked; later events name the
  // target, so the request itself carries the mark.
  //
  // A poll and a request the user made never overlap on one region. A poll
  // answered before the user's request commits but swapped in after it was
  // sent would replace the element the user's answer is meant for: that
  // answer then lands nowhere and the page shows the state from before (CI,
  // 2026-12-01: a cancel recorded, the page still "queued"). So a user's
  // request aborts the region's poll in flight, and no poll starts while a
  // user's request to that region is open.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var poll = isPoll(event.detail.elt);
    var region = event.detail.target;
    var xhr = event.detail.xhr;
    if (poll) {
      if (isPaused() || (region && region.claimcheckBusy)) { event.preventDefault(); return; }
      if (region && xhr) region.claimcheckPollXhr = xhr;
    } else if (region && xhr) {
      var inFlight = region.claimcheckPollXhr;
      region.claimcheckPollXhr = null;
      if (inFlight && inFlight.readyState !== 4) inFlight.abort();
      region.claimcheckBusy = (region.claimcheckBusy || 0) + 1;
      xhr.claimcheckRegion = region;
    }
    if (xhr) xhr.claimcheckPoll = poll;
  });
  function release(event) {
    var xhr = event.detail.xhr, region = xhr && xhr.claimcheckRegion;
    if (region) { region.claimcheckBusy = Math.max(0, (region.claimcheckBusy || 1) - 1); xhr.claimcheckRegion = null; }
  }
  document.addEventListener("htmx:afterRequest", release);
  document.addEventListener("htmx:sendAbort", release);
  document.addEventListener("htmx:beforeSwap", function (event) {
    var region = event.detail.target;
    if (!event.detail.xhr || !event.detail.xhr.claimcheckPoll || !region || !region.id) return;
    var state = capture(region);
    if (!state.controls.length && !state.focus) return;
    // Would every dirty control find its place in the new content? If not
    // (the form is gone: the ticket finished, the row left the page), hold
    // this refresh rather than lose what was typed.
    var incoming = document.createElement("template");
    incoming.innerHTML = event.detail.serverResponse || "";
    var missing = state.controls.some(function (item) {
      return !incoming.content.querySelector(item.selector);
    });
    if (missing) {
      event.detail.shouldSwap = false;
      hold(region, true);
      stamp();
      return;
    }
    saved[region.id] = state;
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    Object.keys(saved).forEach(function (id) {
      var region = document.getElementById(id);
      if (region) { restore(region, saved[id]); hold(region, false); }
      delete saved[id];
    });
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.xhr && event.detail.xhr.claimcheckPoll && event.detail.successful) stamp();
  });

  // Wake on a notification (issue 12; console/live.py). A region with
  // data-live-watch asks the server to wait until what it shows changed
  // (its data-live-token); the answer "changed" refreshes it, at most every
  // data-live-min seconds, through the same htmx request a poll makes (so
  // everything above holds), and the region it swaps in watches from its
  // own token. "live": false (the listener down, no slot free) polls on
  // data-live-period until retry_s. Nothing watches while refresh is paused
  // or the tab is hidden: a watch holds a server thread.
  var lastRefresh = {}; // region id -> when it last asked for a refresh
  var liveOffUntil = 0;
  var watches = [];     // regions whose watch is in flight
  function refreshSoon(region, delay) {
    if (region.claimcheckTimer) return;
    region.claimcheckTimer = window.setTimeout(function () {
      region.claimcheckTimer = null;
      if (!region.isConnected) return;
      lastRefresh[region.id] = Date.now();
      htmx.trigger(region, "claimcheck:changed");
    }, Math.max(0, delay));
  }
  function watch(region) {
    if (!region.isConnected || region.claimcheckWatch || region.claimcheckTimer) return;
    if (isPaused() || document.hidden) return;
    var period = (Number(region.dataset.livePeriod) || 10) * 1000;
    if (Date.now() < liveOffUntil) { refreshSoon(region, period); return; }
    var token = region.claimcheckToken !== undefined ? region.claimcheckToken : (region.dataset.liveToken || "");
    var url = region.dataset.liveWatch;
    url += (url.indexOf("?") < 0 ? "?" : "&") + "token=" + encodeURIComponent(token);
    var control = new AbortController();
    region.claimcheckWatch = control;
    watches.push(region);
    function done() {
      region.claimcheckWatch = null;
      watches = watches.filter(function (r) { return r !== region; });
    }
    fetch(url, { signal: control.signal, credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("watch answered " + response.status);
        return response.json();
      })
      .then(function (answer) {
        done();
        if (!answer.live) {
          liveOffUntil = Date.now() + (answer.retry_s ? answer.retry_s * 1000 : 36e5);
          refreshSoon(region, period);
          return;
        }
        region.claimcheckToken = answer.token;
        if (!answer.changed) { stamp(); watch(region); return; } // current as of now
        var min = (Number(region.dataset.liveMin) || 1) * 1000;
        refreshSoon(region, (lastRefresh[region.id] || 0) + min - Date.now());
      })
      .catch(function (error) {
        done();
        // Aborted: the region left the page or refresh paused. Otherwise
        // (logged out, server down) poll: the poll's own answer says why.
        if (error.name !== "AbortError") refreshSoon(region, period);
      });
  }
  function stopWatches(all) {
    watches.slice().forEach(function (region) {
      if (all || !region.isConnected) region.claimcheckWatch.abort();
    });
  }
  function startWatches() {
    stopWatches(false);
    document.querySelectorAll("[data-live-watch]").forEach(watch);
  }
  // A refresh swapped in (new token), was held or failed, or a user's
  // request ended: every region on the page watches again, once.
  document.addEventListener("htmx:afterSettle", startWatches);
  document.addEventListener("htmx:afterRequest", function () { window.setTimeout(startWatches, 0); });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) stopWatches(true); else startWatches();
  });
  document.addEventListener("claimcheck:live", function () {
    if (isPaused()) stopWatches(true); else startWatches();
  });

  document.addEventListener("DOMContentLoaded", function () {
    showToggle();
    stamp();
    var button = document.getElementById("live-toggle");
    if (button) button.addEventListener("click", function () { setPaused(!isPaused()); });
    startWatches();
  });
  window.claimcheckLive = { toggle: function () { setPaused(!isPaused()); } };
})();

// Confirmations that say what will happen; copy buttons for full ids.
(function () {
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.hasAttribute || !form.hasAttribute("data-confirm-bulk")) return;
    // Back to the list as it is now (filters change the URL without a reload).
    if (form.elements.next) form.elements.next.value = window.location.pathname + window.location.search;
    var picked = document.querySelectorAll('input[name="ticket"][form="' + form.id + '"]:checked').length;
    var action = form.elements.action.value;
    var reason = form.elements.reason.value.trim();
    if (!picked) {
      event.preventDefault();
      window.alert("Select at least one ticket first.");
      return;
    }
    if (!action || !reason) return; // the browser's own required-field check says why
    var texts = {
      approve: ["Approve " + picked + " ticket(s): each result is released for delivery to its requester.", "approved"],
      cancel: ["Cancel " + picked + " ticket(s): queued or waiting ones are cancelled now, running ones are asked to stop.", "cancelled"],
      retry: ["Retry " + picked + " ticket(s): each failed, cancelled or orphaned one is admitted again as a new ticket" +
        (form.elements.input && form.elements.input.value.trim() ? " with the input given" : "") + ".", "retried"]
    };
    var what = texts[action] || texts.cancel;
    if (!window.confirm(what[0] + " Tickets that cannot be " + what[1] +
        " are refused one by one. Reason recorded: \u201c" + reason + "\u201d")) {
      event.preventDefault();
    }
  });

  // Select all: ticks (or clears) every ticket box of the bulk form shown.
  document.addEventListener("change", function (event) {
    var all = event.target;
    if (!all.matches || !all.matches("input[data-select-all]")) return;
    var formId = all.getAttribute("data-select-all");
    document.querySelectorAll('input[name="ticket"][form="' + formId + '"]').forEach(function (box) {
      box.checked = all.checked;
    });
  });

  function addCopyButtons(root) {
    root.querySelectorAll(".id-full:not([data-copy-ready])").forEach(function (code) {
      code.setAttribute("data-copy-ready", "");
      var button = document.createElement("button");
      button.type = "button";
      button.className = "copy";
      button.textContent = "Copy";
      button.setAttribute("aria-label", "Copy " + code.textContent.trim());
      button.addEventListener("click", function () {
        var text = code.textContent.trim();
        if (navigator.clipboard) {
          navigator.clipboard.writeText(text).then(function () { button.textContent = "Copied"; });
        }
      });
      code.insertAdjacentElement("afterend", button);
    });
  }
  document.addEventListener("DOMContentLoaded", function () { addCopyButtons(document); });
  document.addEventListener("htmx:afterSettle", function (event) { addCopyButtons(event.detail.elt || document); });
})();

// Keyboard shortcuts: "/" search, j/k rows, Enter open, g d dashboard,
// g t tickets, p pause, ? this list (the dialog in base.html).
(function () {
  var pendingG = 0, current = -1;
  function rows() {
    return Array.prototype.filter.call(document.querySelectorAll("main table.grid tbody tr"), function (tr) {
      return tr.querySelector("a");
    });
  }
  function move(step) {
    var list = rows();
    if (!list.length) return;
    list.forEach(function (tr) { tr.classList.remove("current"); });
    current = Math.max(0, Math.min(list.length - 1, current + step));
    list[current].classList.add("current");
    list[current].scrollIntoView({ block: "nearest" });
    list[current].querySelector("a").focus({ preventScroll: true });
  }
  function go(url) { if (url) window.location.assign(url); }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var t = event.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) return;
    var body = document.body, key = event.key;
    if (pendingG && Date.now() - pendingG < 1500) {
      pendingG = 0;
      if (key === "d") { event.preventDefault(); go(body.dataset.dashboardUrl); return; }
      if (key === "t") { event.preventDefault(); go(body.dataset.ticketsUrl); return; }
    }
    if (key === "g") { pendingG = Date.now(); return; }
    if (key === "/") {
      event.preventDefault();
      var search = document.getElementById("search");
      if (search) search.focus(); else go(body.dataset.ticketsUrl + "#search");
    } else if (key === "j") { move(1); }
    else if (key === "k") { move(-1); }
    else if (key === "p" && window.claimcheckLive) { window.claimcheckLive.toggle(); }
    else if (key === "?") {
      var dialog = document.getElementById("shortcuts");
      if (dialog && !dialog.open) dialog.showModal();
    }
  });
  document.addEventListener("DOMContentLoaded", function () {
    if (window.location.hash === "#search") {
      var search = document.getElementById("search");
      if (search) search.focus();
    }
    var help = document.getElementById("help-toggle");
    var dialog = document.getElementById("shortcuts");
    if (help && dialog) help.addEventListener("click", function () { dialog.showModal(); });
  });
})();

// The re-run warning (case page): shown while the re-run would repeat the
// input and budget of a turn that overran; hidden once either is changed.
(function () {
  function canonical(value) {
    if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
    if (value && typeof value === "object") {
      return "{" + Object.keys(value).sort().map(function (k) {
        return JSON.stringify(k) + ":" + canonical(value[k]);
      }).join(",") + "}";
    }
    return JSON.stringify(value);
  }
  function update(form) {
    var warning = form.querySelector("#rerun-warning");
    if (!warning) return;
    var repeated = true;
    var input = form.elements["decision-rerun_input"];
    var budget = form.elements["decision-rerun_budget_s"];
    if (input && input.value.trim()) {
      try {
        repeated = canonical(JSON.parse(input.value)) ===
          canonical(JSON.parse(form.getAttribute("data-repeat-input")));
      } catch (e) { repeated = true; /* not JSON yet: the form will say so */ }
    }
    if (repeated && budget && budget.value.trim()) {
      repeated = Number(budget.value) >= Number(form.getAttribute("data-repeat-budget"));
    }
    warning.hidden = !repeated;
  }
  document.addEventListener("input", function (event) {
    var form = event.target.form;
    if (form && form.id === "decision-form") update(form);
  });
  document.addEventListener("htmx:afterSwap", function () {
    var form = document.getElementById("decision-form");
    if (form) update(form);
  });
})();

// A plain form that asks before it submits (the page's CSP allows no inline
// handlers): data-confirm holds the question.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) event.preventDefault();
});

// Tables on a phone (console.css, "Phones"): each row stacks, each cell
// labelled with its column's header. The labels are copied here from the
// header, so templates stay plain tables; explicit table roles keep a screen
// reader's table navigation once the layout is no longer a table's.
(function () {
  function headers(table) {
    var row = table.tHead && table.tHead.rows[table.tHead.rows.length - 1];
    var names = [];
    if (!row) return names;
    Array.prototype.forEach.call(row.cells, function (th) {
      // A header whose text is not a label (the waterfall's time axis: its
      // ticks would run into one word) names its column in data-label.
      var text = th.getAttribute("data-label") || th.textContent.trim();
      for (var i = 0; i < (th.colSpan || 1); i++) names.push(text);
    });
    return names;
  }
  function label(table) {
    var names = headers(table);
    table.setAttribute("role", "table");
    Array.prototype.forEach.call(table.querySelectorAll(":scope > thead, :scope > tbody"), function (group) {
      group.setAttribute("role", "rowgroup");
    });
    Array.prototype.forEach.call(table.rows, function (tr) {
      tr.setAttribute("role", "row");
      var column = 0;
      Array.prototype.forEach.call(tr.cells, function (cell) {
        var header = cell.tagName === "TH";
        cell.setAttribute("role", header ? "columnheader" : "cell");
        if (!header && names[column] && (cell.colSpan || 1) === 1) cell.setAttribute("data-label", names[column]);
        column += cell.colSpan || 1;
      });
    });
  }
  function labelAll() { document.querySelectorAll("table.grid").forEach(label); }
  document.addEventListener("DOMContentLoaded", labelAll);
  // afterSwap, not afterSettle: a refreshed region is labelled before it paints.
  document.addEventListener("htmx:afterSwap", labelAll);
})();

// The colour theme (top bar): the page switches at once and the choice is
// remembered for the user on the server (POST /preferences/theme/, JSON).
// Without script the same form posts and the page comes back in the theme.
(function () {
  function apply(theme) {
    document.documentElement.setAttribute("data-theme", theme);
    var meta = document.querySelector('meta[name="color-scheme"]');
    if (meta) meta.setAttribute("content", theme === "system" ? "light dark" : theme);
    document.querySelectorAll("form.theme button[name=theme]").forEach(function (button) {
      button.setAttribute("aria-pressed", button.value === theme ? "true" : "false");
    });
  }
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var button = event.submitter;
    if (!form.matches || !form.matches("form.theme") || !button || !button.value) return;
    event.preventDefault();
    var before = document.documentElement.getAttribute("data-theme") || "system";
    apply(button.value);
    fetch(form.action, {
      method: "POST",
      body: new FormData(form, button),
      credentials: "same-origin",
      headers: { Accept: "application/json" }
    }).then(function (response) {
      if (!response.ok) throw new Error(response.status + " " + response.statusText);
    }).catch(function (error) {
      apply(before);
      var box = document.getElementById("messages");
      if (!box) return;
      var p = document.createElement("p");
      p.className = "flash flash-error";
      p.textContent = "The theme could not be saved (" + error.message + "); log in again if your session ended.";
      box.replaceChildren(p);
    });
  });
})();
