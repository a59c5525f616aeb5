/* The review page's script: the verdict filter, opening a run from the index, and each run's timeline, rendered
   from its JSON only when the run is opened. Everything from the runs goes into the page as text (textContent),
   never as markup. */
"use strict";
(function () {
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function folded(label, text, open) {
    const details = el("details", "fold");
    details.appendChild(el("summary", "", label));
    details.appendChild(el("pre", "", text));
    if (open) details.open = true;
    return details;
  }

  function seconds(s) { return (s || 0).toFixed(s >= 10 ? 1 : 2) + " s"; }

  function argumentsOf(args) {
    const box = el("div", "args");
    if (args === null || args === undefined) return box;
    if (typeof args !== "object" || Array.isArray(args)) {
      box.appendChild(el("pre", "", typeof args === "string" ? args : JSON.stringify(args, null, 2)));
      return box;
    }
    for (const [name, value] of Object.entries(args)) {
      const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
      if (text.includes("\n") || text.length > 100) {
        box.appendChild(el("div", "arg-name", name));
        box.appendChild(el("pre", "", text));
      } else {
        const line = el("div", "arg-line");
        line.appendChild(el("span", "arg-name", name + ": "));
        line.appendChild(el("code", "", text));
        box.appendChild(line);
      }
    }
    return box;
  }

  function renderCall(call) {
    const box = el("div", "call" + (call.ok ? "" : " failed"));
    const head = el("div", "call-head");
    head.appendChild(el("span", "tool-name", call.name));
    let outcome = call.ok ? "ok" : "failed";
    if (call.exit !== null && call.exit !== undefined) outcome = "exit " + call.exit;
    if (call.timed_out) outcome = "timed out";
    if (call.format_error) outcome = "bad arguments";
    head.appendChild(el("span", call.ok ? "ok" : "bad", outcome));
    head.appendChild(el("span", "stat", seconds(call.s)));
    if (call.recovered) head.appendChild(el("span", "stat", "written as text, recovered"));
    box.appendChild(head);
    box.appendChild(argumentsOf(call.args));
    if (call.result !== null && call.result !== undefined) {
      box.appendChild(folded("result (" + call.result.length.toLocaleString() + " characters)", call.result));
    }
    return box;
  }

  function renderTurn(turn) {
    const box = el("div", "turn");
    box.dataset.turn = turn.turn;
    const head = el("div", "turn-head");
    head.appendChild(el("b", "", (turn.kind === "sample" ? "Sample, turn " : "Turn ") + turn.turn));
    const tokens = turn.prompt.toLocaleString() + " prompt + " + turn.completion.toLocaleString() + " completion" +
      (turn.cached ? " (" + turn.cached.toLocaleString() + " cached)" : "") + " tokens";
    head.appendChild(el("span", "stat tokens", tokens));
    head.appendChild(el("span", "stat time", "model " + seconds(turn.model_s) + ", tools " + seconds(turn.tools_s)));
    head.appendChild(el("span", "stat cost", "$" + turn.cost.toFixed(4)));
    if (turn.t !== null && turn.t !== undefined) head.appendChild(el("span", "stat", "at " + seconds(turn.t)));
    box.appendChild(head);
    if (turn.reasoning) box.appendChild(folded("reasoning", turn.reasoning));
    if (turn.text) box.appendChild(el("pre", "reply", turn.text));
    for (const call of turn.calls) box.appendChild(renderCall(call));
    for (const message of turn.messages) box.appendChild(folded("the harness said (" + message.role + ")", message.text));
    for (const note of turn.notes) box.appendChild(el("div", "note-line", note));
    return box;
  }

  function renderTimeline(container) {
    if (container.dataset.rendered) return;
    container.dataset.rendered = "1";
    const data = JSON.parse(document.getElementById(container.dataset.source).textContent);
    if (data.start.length) {
      const start = el("details", "fold");
      start.appendChild(el("summary", "", "Before the first turn (" + data.start.length + " messages: the system prompt, the task)"));
      for (const message of data.start) start.appendChild(folded(message.role, message.text, true));
      container.appendChild(start);
    }
    const turns = document.createDocumentFragment();
    for (const turn of data.turns) turns.appendChild(renderTurn(turn));
    container.appendChild(turns);
    if (data.stop) {
      const stop = data.stop;
      container.appendChild(el("div", "stop", "Stopped: " + (stop.stop_reason || "?") + (stop.detail ? ": " + stop.detail : "")));
      if (stop.summary) container.appendChild(folded("the model's summary (not used for grading)", stop.summary, true));
    }
  }

  for (const task of document.querySelectorAll("details.task")) {
    task.addEventListener("toggle", function () {
      if (!task.open) return;
      const timeline = task.querySelector(".timeline");
      if (timeline) renderTimeline(timeline);
    });
  }

  function openFromHash() {
    const id = decodeURIComponent(location.hash.slice(1));
    const target = id && document.getElementById(id);
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      target.scrollIntoView();
    }
  }
  window.addEventListener("hashchange", openFromHash);
  openFromHash();

  const buttons = document.querySelectorAll("[data-filter]");
  for (const button of buttons) {
    button.addEventListener("click", function () {
      const wanted = button.dataset.filter;
      for (const b of buttons) b.setAttribute("aria-pressed", b === button ? "true" : "false");
      for (const item of document.querySelectorAll("#index tbody tr, details.task")) {
        item.hidden = wanted !== "all" && item.dataset.verdict !== wanted;
      }
    });
  }
})();
