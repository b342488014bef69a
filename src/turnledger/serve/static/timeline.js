"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("tl-data").textContent);
  const $ = (tag, attrs, ...kids) => {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") el.className = v; else if (k === "style") el.style.cssText = v; else el.setAttribute(k, v);
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) el.append(kid);
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

  function renderSession(model, live) {
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
        live ? $("span", { class: "live", id: "live" }, "● following live") : null),
      $("div", { class: "legend" },
        $("span", {}, $("i", { class: "sw", style: "background:#cbd5e1" }), "submitted, waiting for the model"),
        $("span", {}, $("i", { class: "sw", style: "background:#93c5fd" }), "streaming (preview only)"),
        $("span", { class: "c-committed" }, "✓ committed: in history"),
        $("span", { style: "color:var(--discarded)" }, "✗ discarded: not in history"),
        $("span", { style: "color:var(--rejected)" }, "⊘ rejected: never sent"),
        $("span", { style: "color:var(--late)" }, "◆ late answer, ignored"),
        $("span", { style: "color:#92400e" }, "↷ superseded by a newer question")));
    const tl = $("section", { class: "timeline", id: "timeline" }, $("h3", {}, "Timeline (one row per request id)"));
    const axis = $("div", { class: "axis" });
    for (let i = 0; i <= 5; i++) {
      const t = t0 + (span * i) / 5;
      axis.append($("span", { style: `left:${(i * 20).toFixed(0)}%` }, `+${secs(t - t0)}`));
    }
    tl.append(axis);
    const rowsById = {};
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
      const body = $("div", { class: "body" }, track, status,
        $("div", { class: `why ${row.end === "committed" ? "yes" : "no"}` }, row.explanation));
      if (row.superseded_by) body.append($("div", { class: "rel" }, `↷ superseded by ${row.superseded_by}`));
      const supersedes = model.turns.filter((r) => r.superseded_by === row.request_id).map((r) => r.request_id);
      if (supersedes.length) body.append($("div", { class: "rel" }, `↶ supersedes ${supersedes.join(", ")}`));
      const el = $("div", { class: `row end-${row.end}`, "data-request-id": row.request_id, "data-end": row.end, "data-reason": row.reason },
        $("div", { class: "who" }, $("div", { class: "rid" }, clip(row.request_id, 40)), $("div", { class: "question", title: row.question }, clip(row.question, 90) || "(no question recorded)")),
        body);
      rowsById[row.request_id] = el;
      tl.append(el);
    }
    if (!model.turns.length) tl.append($("p", { class: "empty" }, "No questions yet."));
    const hist = $("aside", { class: "history", id: "history" }, $("h3", {}, `History (${model.history.length} committed turns)`));
    const ol = $("ol", {});
    for (const t of model.history) {
      ol.append($("li", {}, $("div", { class: "q" }, t.question), $("div", { class: "a" }, t.answer), $("div", { class: "rid" }, t.request_id)));
    }
    hist.append(model.history.length ? ol : $("p", { class: "empty" }, "Nothing committed yet."));
    main.append($("div", { class: "cols" }, tl, hist));
    requestAnimationFrame(() => drawArrows(tl, model, rowsById));
  }

  function drawArrows(tl, model, rowsById) {
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("class", "arrows");
    svg.setAttribute("width", tl.clientWidth);
    svg.setAttribute("height", tl.clientHeight);
    svg.innerHTML = '<defs><marker id="ah" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#92400e"/></marker></defs>';
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
  function follow(id) {
    if (source) source.close();
    for (const a of document.querySelectorAll("#sessions a")) a.classList.toggle("current", a.dataset.sessionId === id);
    source = new EventSource(`v1/sessions/${encodeURIComponent(id)}/follow`);
    source.addEventListener("timeline", (e) => renderSession(JSON.parse(e.data), true));
    source.onerror = () => { const el = document.getElementById("live"); if (el) el.textContent = "○ reconnecting…"; };
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

  function fromHash() {
    const m = /^#session=(.+)$/.exec(location.hash);
    if (m) follow(decodeURIComponent(m[1]));
  }

  if (DATA) {
    document.getElementById("sessions").classList.add("hidden");
    renderSession(DATA, false);
  } else {
    loadSessions().then(fromHash);
    window.addEventListener("hashchange", fromHash);
    setInterval(() => loadSessions().then(() => {
      const m = /^#session=(.+)$/.exec(location.hash);
      const id = m ? decodeURIComponent(m[1]) : null;
      for (const a of document.querySelectorAll("#sessions a")) a.classList.toggle("current", a.dataset.sessionId === id);
    }), 5000);
  }
})();
