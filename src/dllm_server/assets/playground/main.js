// The playground page: reads the controls, streams one request with its denoising progress,
// draws it live, and keeps the whole history so the slider replays it forward by forward.
// One request per tab at a time; other tabs are independent requests.
import {RequestError, serverInfo, stream} from "./api.js";
import {drawChart} from "./chart.js";
import {answerLength, Denoising} from "./denoising.js";
import {CanvasView, drawLegend} from "./view.js";

const $ = id => document.getElementById(id);
const view = new CanvasView($("canvas"));
const NUMBER_FIELDS = ["max_tokens", "block_length", "threshold", "steps", "factor", "entropy_bound", "slo_ms",
                       "temperature", "seed", "edit_threshold", "max_post_edit_steps"];
let info = null;
let run = null;             // the request on screen
let conversation = [];      // chat turns so far: [{role, content}]
let playing = null;         // replay timer

// ---- server info: defaults, whether a key is needed, which ids end an answer ----
async function loadInfo() {
  try {
    info = await serverInfo();
  } catch (_) {
    $("server-status").textContent = "server unreachable: retrying…";
    setTimeout(loadInfo, 3000);
    return;
  }
  $("server-status").textContent = `${info.model} · ${info.ready ? "ready" : "starting…"}`
    + (info.auth_required ? " · API key required" : "");
  $("key-hint").textContent = info.auth_required ? "(required by this server)" : "(not required by this server)";
  if ($("block_length").value === "") $("block_length").value = info.defaults.block_length;
  if ($("threshold").value === "") $("threshold").value = info.defaults.threshold;
  $("slo-hint").textContent = info.threshold_policy === "slo" ? "(each block's threshold is chosen to meet it)"
    : "(reported; thresholds are fixed here)";
  if (info.default_slo_ms !== null) $("slo_ms").placeholder = `server: ${info.default_slo_ms}`;
  if (!info.ready) setTimeout(loadInfo, 2000);
}

function mode() {
  return document.querySelector("input[name=mode]:checked").value;
}

function requestBody() {
  const body = {stream: true, stream_options: {include_progress: true, include_usage: true}};
  for (const name of NUMBER_FIELDS) {
    const v = $(name).value.trim();
    if (v !== "") body[name] = Number(v);
  }
  if ($("ignore_eos").checked) body.ignore_eos = true;
  const prompt = $("prompt").value;
  if (mode() === "chat") body.messages = [...conversation, {role: "user", content: prompt}];
  else body.prompt = prompt;
  return body;
}

// ---- one request ----
async function send(event) {
  event.preventDefault();
  if (run && run.state === "running") return;
  stopReplay();
  const body = requestBody();
  const defaults = info ? info.defaults : {block_length: 32, chat_max_tokens: 128, completion_max_tokens: 16};
  const maxTokens = body.max_tokens || (mode() === "chat" ? defaults.chat_max_tokens : defaults.completion_max_tokens);
  const blockLength = body.block_length || defaults.block_length;
  run = {mode: mode(), body, maxTokens, model: null, text: "", finish: null, summary: null, usage: null,
         sentAt: performance.now(), firstAt: null, endAt: null, state: "running", controller: new AbortController()};
  const mine = run;
  setRunning(true);
  showMessage("");
  $("answer").textContent = "";
  $("caption").textContent = "Sent; waiting for the server…";
  const fresh = (answerLen, bl, blockOffset = 0) => new Denoising({answerLen, blockLength: bl, maxTokens, blockOffset,
                                                                    stopIds: info ? info.stop_token_ids : []});
  try {
    await stream(mine.mode === "chat" ? "/v1/chat/completions" : "/v1/completions", body, {
      key: $("api_key").value.trim(), signal: mine.controller.signal,
      onOpen: () => {        // accepted: the canvas starts fully masked
        mine.model = fresh(answerLength(maxTokens, blockLength), blockLength);
        view.build(mine.model);
        render();
      },
      onEvent: obj => onEvent(mine, obj, fresh),
    });
    mine.state = "done";
  } catch (err) {
    if (!(err instanceof RequestError)) throw err;
    mine.state = err.kind === "stopped" ? "stopped" : "failed";
    showMessage(err.message, err.kind === "stopped" ? "info" : "error");
    if (!mine.model && mine === run) $("caption").textContent = "Nothing was decoded.";
  }
  mine.endAt = performance.now();
  if (mine !== run) return;
  setRunning(false);
  if (mine.state === "done" && mine.mode === "chat") {
    conversation = [...body.messages, {role: "assistant", content: mine.text}];
    drawConversation();
  }
  enableReplay();
  render();
}

function onEvent(mine, obj, fresh) {
  if (obj.choices && obj.choices.length === 0 && obj.dllm) {
    const d = obj.dllm;
    const offset = d.block_offset || 0;
    if (!mine.model || mine.model.answerLen !== d.answer_len || mine.model.blockLength !== d.block_length
        || mine.model.blockOffset !== offset) {
      mine.model = fresh(d.answer_len, d.block_length, offset);     // the server's geometry wins
      view.build(mine.model);
    }
    if (mine.firstAt === null) mine.firstAt = performance.now();
    mine.model.add(d);
    scheduleRender();
    return;
  }
  if (obj.usage) mine.usage = obj.usage;
  const choice = obj.choices && obj.choices[0];
  if (!choice) return;
  mine.text += (mine.mode === "chat" ? choice.delta.content : choice.text) || "";
  if (choice.finish_reason) mine.finish = choice.finish_reason;
  if (choice.dllm) mine.summary = choice.dllm;
  scheduleRender();
}

function stop() {
  if (run && run.state === "running") run.controller.abort();   // the server aborts on disconnect
}

// ---- drawing ----
let renderPending = false;

function scheduleRender() {       // at most once a frame; the timer covers a tab not being painted
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(render);
  setTimeout(render, 100);
}

function shownStep() {
  return run.state === "running" ? run.model.length : Number($("slider").value);
}

function render() {
  renderPending = false;
  document.body.dataset.run = run ? run.state : "idle";
  if (!run || !run.model) return;
  const m = run.model, k = shownStep(), finished = run.state !== "running";
  view.show(m, k, {finished: finished && run.state === "done", byForward: $("show-forward").checked});
  drawLegend($("legend"), k, {beyond: m.maxTokens < m.answerLen, skipped: view.skipped});
  drawChart($("chart"), m, finished ? k : m.length);
  $("answer").textContent = run.text;
  $("caption").textContent = caption(m, k);
  drawNumbers(m, k);
}

function caption(m, k) {
  const live = run.state === "running";
  if (k === 0) return live ? `Waiting for the first forward: all ${m.answerLen} positions masked.`
    : `Before the first forward: all ${m.answerLen} positions masked.`;
  const f = m.forwards[k - 1];
  const head = live ? `Denoising… forward ${k} ·` : k === m.length && run.state === "done"
    ? `Finished (${run.finish}) after ${k} forwards; the last:` : `Forward ${k} of ${m.length} ·`;
  const n = f.positions.length - f.edits;
  return `${head} block ${f.block} (its forward ${f.step + 1}) · committed ${n} position${n === 1 ? "" : "s"} · `
    + (f.edits ? `rewrote ${f.edits} · ` : "") + `${f.masked} masked left`;
}

// The commit rule: the request's own steps, factor or entropy bound, else the thresholds the
// server's decode policy chose (per block: an SLO policy may lower them).
function commitRule(s) {
  const b = run.body;
  if (b.steps) return `${b.steps} steps (fixed)`;
  if (b.factor) return `factor ${b.factor}`;
  if (b.entropy_bound != null) return `entropy bound ${b.entropy_bound}`;
  const editing = b.edit_threshold != null ? ` + editing ${b.edit_threshold}` : "";
  if (!s) return `threshold ${b.threshold ?? (info ? info.defaults.threshold : "default")}${editing} (asked)`;
  const distinct = [...new Set(s.thresholds)];
  return (distinct.length === 1 ? `threshold ${distinct[0]}` : `thresholds ${s.thresholds.join(" · ")}`)
    + `${editing} (used)`;
}

function drawNumbers(m, k) {
  const counts = m.forwards.slice(0, k).map(f => f.positions.length - f.edits);
  const total = counts.reduce((a, b) => a + b, 0);
  const edits = m.forwards.slice(0, k).reduce((a, f) => a + f.edits, 0);
  const steps = m.stepsPerBlock(k).filter(s => s > 0);
  const s = run.summary;
  const ms = t => (t === null ? "–" : `${Math.round(t - run.sentAt)} ms`);
  const end = run.endAt ?? performance.now();
  const rows = [
    ["forwards", `${k}${k < m.length ? " of " + m.length : ""}`],
    ["positions per forward", counts.length ? `${(total / counts.length).toFixed(2)} (max ${Math.max(...counts)})` : "–"],
    ["positions committed", `${total} of ${m.answerLen}` + (edits ? ` · ${edits} rewrites (token editing)` : "")],
    ["steps per block", steps.length ? steps.join(" · ") : "–"],
    ["blocks decoded", `${steps.length} of ${m.numBlocks}`],
    ["block length", String(s ? s.block_length : m.blockLength)],
    ["commit rule", commitRule(s)],
    ["first forward after", ms(run.firstAt)],
    ["latency", run.state === "running" ? `${((end - run.sentAt) / 1000).toFixed(2)} s so far`
      : `${((end - run.sentAt) / 1000).toFixed(2)} s`],
    ["finish", run.finish || run.state],
  ];
  if (s && s.slo_ms !== undefined) {
    rows.push(["SLO", `${s.slo_met ? "met" : "missed"}: ${s.latency_ms} ms for ${s.slo_ms} ms`]);
  }
  if (run.usage) rows.push(["tokens", `${run.usage.prompt_tokens} prompt · ${run.usage.completion_tokens} answer`]);
  const dl = $("numbers");
  dl.replaceChildren();
  for (const [name, value] of rows) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = value;
    dl.append(dt, dd);
  }
}

function drawConversation() {
  const list = $("turns");
  list.replaceChildren(...conversation.map(t => {
    const li = document.createElement("li");
    li.className = t.role;
    li.textContent = `${t.role === "user" ? "you" : "model"}: ${t.content}`;
    return li;
  }));
  $("conversation").hidden = mode() !== "chat" || conversation.length === 0;
}

function showMessage(text, kind = "error") {
  const box = $("message");
  box.hidden = !text;
  box.className = kind;
  box.textContent = text;
}

function setRunning(running) {
  $("send").disabled = running;
  $("stop").disabled = !running;
  for (const id of ["first", "prev", "next", "last", "play", "slider"]) $(id).disabled = true;
  document.body.dataset.run = running ? "running" : run.state;
}

// ---- replay ----
function enableReplay() {
  const n = run.model ? run.model.length : 0;
  $("slider").max = String(n);
  $("slider").value = String(n);
  for (const id of ["first", "prev", "next", "last", "play", "slider"]) $(id).disabled = n === 0;
}

function goTo(k) {
  const n = Number($("slider").max);
  $("slider").value = String(Math.max(0, Math.min(n, k)));
  render();
}

function stopReplay() {
  if (playing !== null) clearInterval(playing);
  playing = null;
  $("play").textContent = "Play";
}

function togglePlay() {
  if (playing !== null) return stopReplay();
  if (Number($("slider").value) >= Number($("slider").max)) goTo(0);
  $("play").textContent = "Pause";
  playing = setInterval(() => {
    const k = Number($("slider").value) + 1;
    goTo(k);
    if (k >= Number($("slider").max)) stopReplay();
  }, 120);
}

// ---- wiring ----
$("request-form").addEventListener("submit", send);
$("stop").addEventListener("click", stop);
$("prompt").addEventListener("keydown", e => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("request-form").requestSubmit();
});
document.addEventListener("keydown", e => {
  if (e.key === "Escape") stop();
});
$("slider").addEventListener("input", () => { stopReplay(); render(); });
$("first").addEventListener("click", () => { stopReplay(); goTo(0); });
$("prev").addEventListener("click", () => { stopReplay(); goTo(Number($("slider").value) - 1); });
$("next").addEventListener("click", () => { stopReplay(); goTo(Number($("slider").value) + 1); });
$("last").addEventListener("click", () => { stopReplay(); goTo(Number($("slider").max)); });
$("play").addEventListener("click", togglePlay);
$("show-forward").addEventListener("change", render);
$("new-chat").addEventListener("click", () => { conversation = []; drawConversation(); });
const EXAMPLES = {chat: "Good morrow, my lord. What news?", completion: "ROMEO. But soft, what light"};
for (const radio of document.querySelectorAll("input[name=mode]")) {
  radio.addEventListener("change", () => {
    if (Object.values(EXAMPLES).includes($("prompt").value)) $("prompt").value = EXAMPLES[mode()];
    drawConversation();
  });
}
drawLegend($("legend"), 0);
loadInfo();
