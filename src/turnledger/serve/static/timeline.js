"use strict";
(function () {
  const PAGE = JSON.parse(document.getElementById("tl-data").textContent);
  const DATA = PAGE.model;

  // Control and bidirectional characters are shown as escapes, as the command
  // line shows them: the same ranges (turnledger.text), from the page's data.
  const hex = (n, width) => n.toString(16).padStart(width, "0");
  const ranges = PAGE.invisible.map(([lo, hi]) => `\\u{${hex(lo, 1)}}-\\u{${hex(hi, 1)}}`).join("");
  const INVISIBLE = new RegExp(`[${ranges}]`, "gu");
  const INVISIBLE_IN_LINES = new RegExp(`(?![\\t\\n])[${ranges}]`, "gu");
  const escaped = (c) => {
    const n = c.codePointAt(0);
    return n < 0x100 ? `\\x${hex(n, 2)}` : `\\u${hex(n, 4)}`;
  };
  const visible = (text) => text.replace(INVISIBLE, escaped);
  // Text as nodes: each escape in a span of its own, so it reads as one.
  const shown = (text, lines) => {
    const out = document.createDocumentFragment();
    let at = 0;
    for (const m of text.matchAll(lines ? INVISIBLE_IN_LINES : INVISIBLE)) {
      out.append(text.slice(at, m.index));
      const esc = document.createElement("span");
      esc.className = "esc";
      esc.textContent = escaped(m[0]);
      out.append(esc);
      at = m.index + m[0].length;
    }
    out.append(text.slice(at));
    return out;
  };
  const lines = (text) => shown(text, true);

  // An id as one path segment of the API: turnledger.serve.quote_id's rule.
  // Percent-encoded UTF-8; "~" in front of "." and ".." (dot segments, which
  // URL parsers remove) and of an id that starts with "~".
  const idSegment = (id) =>
    (id === "." || id === ".." || id.startsWith("~") ? "~" : "") + encodeURIComponent(id);
  window.turnledger = Object.freeze({ idSegment, visible });

  // Stored text only ever enters the page as text nodes (strings among the
  // kids), or as a title shown with its escapes.
  const $ = (tag, attrs, ...kids) => {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") el.className = v;
      else if (k === "style") el.style.cssText = v;
      else el.setAttribute(k, k === "title" ? visible(v) : v);
    }
    for (const kid of kids) {
      if (kid !== null && kid !== undefined) el.append(typeof kid === "string" ? shown(kid, false) : kid);
    }
    return el;
  };
  const secs = (s) => (s < 10 ? s.toFixed(3) : s.toFixed(1)) + "s";
  const clip = (text, n) => (text.length > n ? text.slice(0, n - 1) + "…" : text);
  const END_MARK = { committed: "✓", discarded: "✗", rejected: "⊘" };

  function endLabel(row) {
    if (row.end === "committed") return "committed";
    if (row.end === "in_flight") return "in flight";
    const reason = row.detail ? `${row.reason} (${clip(row.detail, 40)})` : row.reason;
    return `${row.end}: ${reason}`;
  }

  function facts(row) {
    const out = [];
    if (row.end !== "rejected") out.push(`${row.turns_sent} earlier turns sent, ${row.request_bytes} bytes`);
    if (row.end === "committed") out.push(`answer ${row.answer_chars} chars`);
    if (row.end === "discarded") out.push(`preview ${row.preview_chars} chars`);
    const u = row.usage;
    if (u) out.push(`tokens ${u.prompt_tokens ?? "?"} in + ${u.completion_tokens ?? "?"} out`);
    else if (row.end === "committed") out.push("tokens not reported");
    return out.join(" · ");
  }

  // A request sent again, smaller, after the server refused it.
  function retryLine(r) {
    const budget = r.token_budget === null ? "" : ` of ${r.token_budget}`;
    const why = r.detail ? `${r.reason} (${clip(r.detail, 60)})` : r.reason;
    return `↻ retried after ${why}: sent again ${r.turns_sent} earlier turns, ${r.turns_dropped} dropped, ` +
      `${r.request_bytes} bytes, ~${r.estimated_prompt_tokens} tokens${budget}`;
  }

  // One tool round: each call's name, id and sizes (never its arguments or result).
  function toolRound(round) {
    const el = $("div", { class: "tools", "data-round": String(round.round) }, `⚙ tool round ${round.round}:`);
    for (const c of round.calls) {
      const result = c.result_bytes === null ? "no result"
        : `${c.result_bytes} B back, ${c.duration_ms} ms, ${c.is_error ? "error" : "ok"}`;
      el.append($("span", { class: `tool-call${c.is_error ? " error" : ""}`, "data-call-id": c.call_id, "data-tool": c.name },
        `${c.name} [${c.call_id}] ${c.argument_bytes} B → ${result}`));
    }
    if (round.request_bytes !== null) el.append($("span", { class: "facts" }, `results sent back in ${round.request_bytes} bytes`));
    return el;
  }

  // The live page's own state, kept across the redraws the follow stream
  // causes: the question being edited, the last command's status, and
  // whether a command is running (its buttons are then disabled).
  const ui = { editing: null, status: "", statusKind: "", busy: false, refocus: false };

  function setStatus(text, kind) {
    ui.status = text;
    ui.statusKind = kind;
    const el = document.getElementById("branch-status");
    if (el) {
      el.className = `status-line ${kind}`;
      el.textContent = visible(text);
    }
  }

  const button = (attrs, label, onClick) => {
    const el = $("button", { type: "button", ...attrs }, label);
    if (ui.busy) el.disabled = true;
    el.addEventListener("click", onClick);
    return el;
  };

  // The outcome an edit's or a regenerate's stream ended with (the data of
  // its last "outcome" event), or null.
  function lastOutcome(text) {
    let found = null;
    for (const block of text.split(/\r?\n\r?\n/)) {
      const fields = block.split(/\r?\n/);
      if (!fields.includes("event: outcome")) continue;
      const data = fields.filter((f) => f.startsWith("data:")).map((f) => f.slice(5).trim()).join("\n");
      try { found = JSON.parse(data); } catch { found = null; }
    }
    return found;
  }

  // One of serve's branch commands (POST .../edit, .../regenerate,
  // .../switch); the follow stream redraws the page with what it wrote.
  async function command(sessionId, path, body, what) {
    if (ui.busy) return;
    ui.busy = true;
    for (const b of document.querySelectorAll("#history button")) b.disabled = true;
    setStatus(`${what}…`, "busy");
    try {
      const res = await fetch(`v1/sessions/${idSegment(sessionId)}/${path}`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      if (!res.ok) {
        let why = `HTTP ${res.status}`;
        try {
          const err = (await res.json()).error;
          why = `${err.message} (${res.status} ${err.code})`;
        } catch { /* no JSON body: the status says it */ }
        setStatus(`${what} refused: ${why}`, "error");
        return;
      }
      const text = await res.text();
      if (path === "switch") {
        setStatus(`${what}: branch ${JSON.parse(text).active_branch} is active`, "ok");
        return;
      }
      // An edit's or a regenerate's answer streams to its end.
      const outcome = lastOutcome(text);
      if (outcome === null) setStatus(`${what}: the stream ended without an outcome`, "error");
      else if (outcome.kind === "committed") setStatus(`${what}: committed (${outcome.request_id})`, "ok");
      else setStatus(`${what}: ${outcome.kind} (${outcome.reason})`, "error");
    } catch {
      setStatus(`${what} failed: the service did not answer`, "error");
    } finally {
      ui.busy = false;
      for (const b of document.querySelectorAll("#history button")) b.disabled = false;
    }
  }

  // A history turn's edit control: a button, or (while editing) the text
  // to ask instead and the buttons that ask it or give up.
  function editControl(model, turn, index) {
    const editing = ui.editing;
    if (!editing || editing.sessionId !== model.session_id || editing.index !== index) {
      return button({ class: "edit-turn", "data-turn-index": String(index) }, "✎ edit", () => {
        ui.editing = { sessionId: model.session_id, index, text: turn.question, opening: true };
        renderSession(model, true);
      });
    }
    const box = $("textarea", { class: "edit-text", rows: "2", "aria-label": `question ${index + 1}, edited` });
    box.value = editing.text;
    // A redraw (the follow stream) replaces the box: keep the text, the
    // focus and the caret it had.
    const keep = () => {
      editing.text = box.value;
      editing.caret = box.selectionStart;
    };
    box.addEventListener("input", keep);
    box.addEventListener("keyup", keep);
    if (ui.refocus) {
      requestAnimationFrame(() => {
        if (!box.isConnected) return;
        ui.refocus = false;
        box.focus();
        const at = editing.caret ?? box.value.length;
        box.setSelectionRange(at, at);
      });
    }
    const ask = button({ class: "edit-ask" }, "ask instead (a new branch)", () => {
      ui.editing = null;
      command(model.session_id, "edit", { turn_index: index, question: editing.text }, `edit of question ${index + 1}`);
      renderSession(model, true);
    });
    const cancel = button({ class: "edit-cancel" }, "cancel", () => {
      ui.editing = null;
      renderSession(model, true);
    });
    return $("div", { class: "editor" }, box, ask, cancel);
  }

  // The session's tree: each branch with the turns it added itself, and the
  // branches that start from it listed just before the turn they ask
  // differently or again (the layout of turnledger.timeline.branch_tree).
  function branchTree(model, live) {
    const branches = model.branches || [];
    const question = {};
    for (const r of model.turns) question[r.request_id] = r.question;
    const kids = {};
    for (const b of branches) if (b.parent !== null) (kids[b.parent] = kids[b.parent] || []).push(b);
    const forks = (list) => {
      const ul = $("ul", { class: "forks" });
      for (const c of list) ul.append(draw(c));
      return ul;
    };
    function draw(b) {
      const from = b.parent === null ? "the root" : `${b.parent} after ${b.at_turn} turns (${b.kind})`;
      // (a request id cut as turnledger log cuts it; the whole one in the title)
      const head = $("div", { class: "bhead", title: b.head ? `head ${b.head}` : b.branch_id },
        `${b.active ? "● " : ""}${b.branch_id}: from ${from} · ${b.length} turns${b.head ? " · head " + clip(b.head, 12) : ""}`);
      if (live && !b.active) {
        head.append(" ", button({ class: "switch-to", "data-branch": b.branch_id }, "⇄ switch here",
          () => command(model.session_id, "switch", { branch: b.branch_id }, `switch to ${b.branch_id}`)));
      }
      const li = $("li", { class: b.active ? "branch active" : "branch", "data-branch-id": b.branch_id }, head);
      // (a stable sort: branches that start at the same turn stay in log order)
      const waiting = (kids[b.branch_id] || []).slice().sort((p, q) => p.at_turn - q.at_turn);
      let n = b.at_turn;
      for (const rid of b.turns || []) {
        n += 1;
        const here = [];
        while (waiting.length && waiting[0].at_turn < n) here.push(waiting.shift());
        if (here.length) li.append(forks(here));
        li.append($("div", { class: "bturn", "data-request-id": rid, "data-turn": String(n) },
          $("span", { class: "n" }, `${n}.`), " ", clip(question[rid] || "", 60)));
      }
      if (waiting.length) li.append(forks(waiting));
      return li;
    }
    const tree = $("ul", { id: "branches", class: "tree" });
    for (const b of branches) if (b.parent === null) tree.append(draw(b));
    return tree;
  }

  function renderSession(model, live) {
    // The edit box gets the focus when it opens, and keeps it across redraws.
    // A refocus still waiting for its frame counts as focused: two redraws
    // within one frame must not lose it.
    const focused = document.activeElement;
    ui.refocus = ui.editing !== null &&
      (ui.editing.opening || ui.refocus || (focused !== null && focused.classList.contains("edit-text")));
    if (ui.editing) ui.editing.opening = false;
    const main = document.getElementById("session");
    main.replaceChildren();
    const t0 = model.t0 || 0;
    const span = Math.max((model.t1 || t0) - t0, 0.001) * 1.04;
    const x = (t) => (100 * (t - t0)) / span;
    const pct = (t) => `${x(t).toFixed(3)}%`;
    const kept = model.turns.filter((r) => r.end === "committed").length;
    main.append(
      $("div", { class: "summary" },
        $("h2", {}, model.session_id),
        $("span", {}, `phase ${model.phase} · version ${model.version} · ${model.turns.length} requests · ${kept} in history`),
        $("span", { id: "active-branch", "data-branch": model.active_branch || "main" }, `branch ${model.active_branch || "main"} active · ${(model.branches || []).length || 1} branches`),
        live ? $("span", { class: "live", id: "live" }, "● following live") : null),
      $("div", { class: "legend" },
        $("span", {}, $("i", { class: "sw", style: "background:#cbd5e1" }), "submitted, waiting for the model"),
        $("span", {}, $("i", { class: "sw", style: "background:#93c5fd" }), "streaming (preview only)"),
        $("span", { class: "c-committed" }, "✓ committed: in history"),
        $("span", { style: "color:var(--discarded)" }, "✗ discarded: not in history"),
        $("span", { style: "color:var(--rejected)" }, "⊘ rejected: never sent"),
        $("span", { style: "color:var(--late)" }, "◆ late answer, ignored"),
        $("span", { style: "color:var(--retry)" }, "↻ sent again, smaller"),
        $("span", { style: "color:var(--tool)" }, "⚙ tool round"),
        $("span", { style: "color:#92400e" }, "↷ superseded by a newer question"),
        $("span", { style: "color:var(--tool)" }, "⑂ starts a branch (edit, regenerate)")));
    const tl = $("section", { class: "timeline", id: "timeline" }, $("h3", {}, "Timeline (one row per request id)"));
    const axis = $("div", { class: "axis" });
    for (let i = 0; i <= 5; i++) {
      const t = t0 + (span * i) / 5;
      axis.append($("span", { style: `left:${(i * 20).toFixed(0)}%` }, `+${secs(t - t0)}`));
    }
    tl.append(axis);
    const rowsById = {};
    const branched = (model.branches || []).length > 1;
    for (const row of model.turns) {
      const track = $("div", { class: "track" });
      const end = row.ended_at ?? model.t1 ?? row.submitted_at;
      const started = row.stream_started_at;
      if (row.end !== "rejected") {
        const pendEnd = started ?? end;
        track.append($("div", { class: "seg pending", style: `left:${pct(row.submitted_at)};width:${(x(pendEnd) - x(row.submitted_at)).toFixed(3)}%`, title: "submitted, waiting" }));
        if (started !== null) {
          track.append($("div", { class: "mark start", style: `left:${pct(started)}`, title: "stream started" }, "▸"));
          track.append($("div", { class: `seg ${row.end === "in_flight" ? "inflight" : "streaming"}`, style: `left:${pct(started)};width:${(x(end) - x(started)).toFixed(3)}%`, title: "streaming" }));
        }
      }
      if (row.end !== "in_flight") {
        track.append($("div", { class: `mark ${row.end}`, style: `left:${pct(end)}`, title: endLabel(row) }, END_MARK[row.end]));
      }
      const status = $("div", { class: "status" }, $("span", { class: `badge ${row.end}` }, endLabel(row)), $("span", { class: "facts" }, facts(row)));
      for (const late of row.late) {
        const delay = late.delay_s === null ? "" : ` ${secs(late.delay_s)} after the turn ended`;
        track.append($("div", { class: "latelink", style: `left:${pct(end)};width:${(x(late.at) - x(end)).toFixed(3)}%` }));
        track.append($("div", { class: "mark late", style: `left:${pct(late.at)}`, title: `late answer (${late.outcome})` }, "◆"));
        status.append($("span", { class: "badge late", "data-late": String(late.delay_s) }, `late answer +${late.delay_s === null ? "?" : secs(late.delay_s)}`));
        status.append($("span", { class: "facts" }, `its ${late.outcome === "completed" ? "complete answer" : "result (" + late.outcome + ")"} arrived${delay} and was ignored`));
      }
      for (const r of row.retries) {
        track.append($("div", { class: "mark retry", style: `left:${pct(r.at)}`, title: `sent again after ${r.reason}` }, "↻"));
      }
      for (const round of row.tool_rounds) {
        track.append($("div", { class: "mark tool", style: `left:${pct(round.requested_at)}`, title: `tool round ${round.round}` }, "⚙"));
      }
      const body = $("div", { class: "body" }, track, status,
        $("div", { class: `why ${row.end === "committed" ? "yes" : "no"}` }, row.explanation));
      for (const r of row.retries) body.append($("div", { class: "retried" }, retryLine(r)));
      for (const round of row.tool_rounds) body.append(toolRound(round));
      if (row.busy_with) body.append($("div", { class: "rel" }, `⊘ busy with ${row.busy_with}`));
      const sb = row.starts_branch;
      if (sb) {
        // (questions numbered from 1, as the history and the tree number them)
        const how = `question ${sb.at_turn + 1} ${sb.kind === "edit" ? "asked differently" : "asked again"}`;
        body.append($("div", { class: "rel branch-start", "data-branch": sb.branch }, `⑂ starts branch ${sb.branch} from ${sb.parent} (${sb.kind}): keeps ${sb.at_turn} turns, ${how}`));
      }
      if (row.summary_sent) {
        body.append($("div", { class: "rel summary-sent", "data-summary-id": row.summary_sent }, `▤ sent summary ${row.summary_sent} in place of ${row.turns_dropped} dropped turns`));
      }
      if (row.superseded_by) body.append($("div", { class: "rel" }, `↷ superseded by ${row.superseded_by}`));
      const supersedes = model.turns.filter((r) => r.superseded_by === row.request_id).map((r) => r.request_id);
      if (supersedes.length) body.append($("div", { class: "rel" }, `↶ supersedes ${supersedes.join(", ")}`));
      const el = $("div", { class: `row end-${row.end}`, "data-request-id": row.request_id, "data-end": row.end, "data-reason": row.reason, "data-branch": row.branch || "main",
        "data-retries": String(row.retries.length), "data-tool-rounds": String(row.tool_rounds.length) },
        $("div", { class: "who" }, $("div", { class: "rid" }, clip(row.request_id, 40)), $("div", { class: "question", title: row.question }, clip(row.question, 90) || "(no question recorded)"),
          branched ? $("div", { class: "on-branch" }, `on ${row.branch || "main"}`) : null),
        body);
      rowsById[row.request_id] = el;
      tl.append(el);
    }
    if (!model.turns.length) tl.append($("p", { class: "empty" }, "No questions yet."));
    const hist = $("aside", { class: "history", id: "history" }, $("h3", {}, `History (${model.history.length} committed turns${(model.branches || []).length > 1 ? ", branch " + model.active_branch : ""})`));
    if (live) hist.append($("div", { id: "branch-status", class: `status-line ${ui.statusKind}` }, ui.status));
    const ol = $("ol", {});
    model.history.forEach((t, i) => {
      const li = $("li", { "data-turn-index": String(i), "data-request-id": t.request_id },
        $("div", { class: "q" }, lines(t.question)), $("div", { class: "a" }, lines(t.answer)), $("div", { class: "rid" }, t.request_id));
      if (live) li.append(editControl(model, t, i));
      ol.append(li);
    });
    hist.append(model.history.length ? ol : $("p", { class: "empty" }, "Nothing committed yet."));
    if (live && model.history.length) {
      hist.append(button({ id: "regenerate" }, "↻ ask the last question again (a new branch)",
        () => command(model.session_id, "regenerate", {}, "regenerate")));
    }
    const branches = model.branches || [];
    if (branches.length > 1) {
      const tree = branchTree(model, live);
      for (const w of model.switches || []) {
        tree.append($("li", { class: "switch", "data-switch-to": w.branch }, `⇄ switched to ${w.branch} at +${secs(w.at - t0)}`));
      }
      hist.append($("h3", {}, "Branches"), tree);
    }
    const summaries = model.summaries || [];
    if (summaries.length) {
      const list = $("ul", { id: "summaries" });
      for (const x of summaries) {
        list.append($("li", { class: "summary", "data-summary-id": x.summary_id, title: x.text },
          `▤ ${x.summary_id}: ${x.branch} turns ${x.start}–${x.end - 1} (${x.first_request_id} … ${x.last_request_id}) · ${x.origin} ${x.origin_name} · ~${x.estimated_tokens} tokens`,
          $("div", { class: "a" }, lines(x.text))));
      }
      hist.append($("h3", {}, "Summaries"), list);
    }
    const pins = model.pins || [];
    if (pins.length) {
      const list = $("ul", { id: "pins" });
      for (const p of pins) list.append($("li", { class: "pin", "data-pin-id": p.pin_id }, `📌 ${p.pin_id} (${p.origin}): `, lines(p.text)));
      hist.append($("h3", {}, "Pinned"), list);
    }
    main.append($("div", { class: "cols" }, tl, hist));
    requestAnimationFrame(() => drawArrows(tl, model, rowsById));
  }

  function drawArrows(tl, model, rowsById) {
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("class", "arrows");
    svg.setAttribute("width", tl.clientWidth);
    svg.setAttribute("height", tl.clientHeight);
    const svgEl = (tag, attrs) => {
      const el = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
      return el;
    };
    const marker = svgEl("marker", { id: "ah", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    marker.append(svgEl("path", { d: "M0,0 L10,5 L0,10 z", fill: "#92400e" }));
    const defs = svgEl("defs", {});
    defs.append(marker);
    svg.append(defs);
    const box = tl.getBoundingClientRect();
    for (const row of model.turns) {
      if (!row.superseded_by || !rowsById[row.superseded_by]) continue;
      const from = rowsById[row.superseded_by].querySelector(".seg, .mark");
      const to = rowsById[row.request_id].querySelector(".mark.discarded");
      if (!from || !to) continue;
      const a = from.getBoundingClientRect(), b = to.getBoundingClientRect();
      const line = document.createElementNS(NS, "path");
      const x1 = a.left - box.left, y1 = a.top - box.top + 4, x2 = b.left - box.left + b.width / 2, y2 = b.bottom - box.top;
      line.setAttribute("d", `M${x1},${y1} C${x1 - 30},${y1 - 20} ${x2 + 30},${y2 + 20} ${x2},${y2}`);
      line.setAttribute("stroke", "#92400e");
      line.setAttribute("fill", "none");
      line.setAttribute("stroke-width", "1.5");
      line.setAttribute("marker-end", "url(#ah)");
      svg.append(line);
    }
    tl.append(svg);
  }

  let source = null;
  const markCurrent = (id) => {
    for (const a of document.querySelectorAll("#sessions a")) a.classList.toggle("current", a.dataset.sessionId === id);
  };

  // A session that cannot be shown: its id and why, in place of any rows.
  function showError(id, why) {
    document.getElementById("session").replaceChildren(
      $("div", { class: "load-error", id: "load-error" },
        $("h2", {}, id), $("p", {}, `This session cannot be shown: ${why}`)));
  }

  function follow(id) {
    if (source) source.close();
    markCurrent(id);
    document.getElementById("session").replaceChildren($("p", { class: "empty" }, `Loading ${id}…`));
    const url = `v1/sessions/${idSegment(id)}`;
    const stream = source = new EventSource(`${url}/follow`);
    stream.addEventListener("timeline", (e) => {
      if (stream !== source) return;
      const model = JSON.parse(e.data);
      if (model.session_id === id) renderSession(model, true);
      else showError(id, "the service answered with another session");
    });
    stream.onerror = () => {
      if (stream !== source) return;
      if (stream.readyState !== EventSource.CLOSED) {
        const el = document.getElementById("live");
        if (el) el.textContent = "○ reconnecting…";
        return;
      }
      // The service refused the stream: ask it why, and say so.
      fetch(`${url}/timeline`)
        .then((res) => res.json())
        .then((body) => (body.error ? body.error.message : null), () => "the service did not answer")
        .then((why) => {
          if (stream !== source) return;
          if (why === null) setTimeout(() => { if (stream === source) follow(id); }, 1000);
          else showError(id, why);
        });
    };
  }

  async function loadSessions() {
    const nav = document.getElementById("sessions");
    const res = await fetch("v1/sessions?limit=1000");
    const body = await res.json();
    nav.replaceChildren($("h3", {}, `Sessions (${body.total})`));
    for (const s of body.sessions) {
      const a = $("a", { href: `#session=${encodeURIComponent(s.session_id)}`, "data-session-id": s.session_id },
        $("div", { class: "sid" }, s.session_id),
        $("div", { class: "meta" }, `${s.turns} in history · ${s.requests} requests · ${s.last_outcome || s.phase}`));
      nav.append(a);
    }
    if (!body.sessions.length) nav.append($("p", { class: "empty" }, "No sessions yet."));
  }

  // The session the address names: its id, "" for none, null if unreadable.
  function hashId() {
    const m = /^#session=(.+)$/.exec(location.hash);
    if (!m) return "";
    try { return decodeURIComponent(m[1]); } catch { return null; }
  }

  function fromHash() {
    const id = hashId();
    if (id === null) {
      if (source) source.close();
      source = null;
      showError(location.hash.slice(1), "the address does not name a session (bad percent-encoding)");
    } else if (id) follow(id);
  }

  if (DATA) {
    document.getElementById("sessions").classList.add("hidden");
    renderSession(DATA, false);
  } else {
    loadSessions().then(fromHash);
    window.addEventListener("hashchange", fromHash);
    setInterval(() => loadSessions().then(() => markCurrent(hashId())), 5000);
  }
})();
