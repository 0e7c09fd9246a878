// Drawing the canvas: one row per block, one cell per answer position, each committed cell
// coloured by the forward that committed it (the legend says which colour is which forward, and
// every cell's tooltip says it in words). Cells are made once per request and only the ones
// whose look changes are touched, so a long answer redraws cheaply at every forward.
import {cellText} from "./denoising.js";

// Viridis anchors: ordered in lightness, readable for the common colour-vision deficiencies.
const STOPS = ["#440154", "#482878", "#3e4a89", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58",
               "#b5de2b", "#fde725"];

function rgb(hex) {
  return [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
}

// Colour of forward f when forwards 1..n are shown: early dark purple, late yellow.
export function forwardColour(f, n) {
  const t = n <= 1 ? 1 : (f - 1) / (n - 1);
  const x = t * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const a = rgb(STOPS[i]), b = rgb(STOPS[i + 1]), u = x - i;
  const c = a.map((v, j) => Math.round(v + (b[j] - v) * u));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// Black or white text, whichever contrasts more with the background (WCAG luminance).
export function inkFor(colour) {
  const [r, g, b] = colour.match(/\d+/g).map(Number).map(v => {
    const s = v / 255;
    return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  });
  const lum = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return (lum + 0.05) / 0.05 > 1.05 / (lum + 0.05) ? "#000" : "#fff";
}

export class CanvasView {
  constructor(root) {
    this.root = root;
    this.cells = [];
    this.rows = [];
    this.looks = [];
    this.skipped = false;      // the last view showed cells that were never decoded
  }

  build(model) {
    this.root.replaceChildren();
    this.cells = [];
    this.rows = [];
    for (let b = 0; b < model.numBlocks; b++) {
      const row = document.createElement("div");
      row.className = "block";
      const label = document.createElement("div");
      label.className = "block-label";
      label.innerHTML = `block ${b}<small></small>`;
      const cells = document.createElement("div");
      cells.className = "cells";
      const [first, end] = model.blockRange(b);
      for (let p = first; p < end; p++) {
        const cell = document.createElement("span");
        cell.className = "cell masked";
        cell.textContent = "░";
        cells.append(cell);
        this.cells.push(cell);
      }
      row.append(label, cells);
      this.root.append(row);
      this.rows.push({row, status: label.querySelector("small")});
    }
    this.looks = new Array(model.answerLen).fill("masked");
  }

  // The canvas after k forwards; `finished`: the request is over (unreached blocks were skipped).
  show(model, k, {finished = false, byForward = false} = {}) {
    const end = finished && k === model.length;
    this.skipped = end && model.committedAt.some(f => f === 0);
    const current = end ? -1 : model.blockAfter(k);
    const steps = model.stepsPerBlock(k);
    for (let p = 0; p < model.answerLen; p++) this._cell(model, p, k, end, byForward);
    this.rows.forEach(({row, status}, b) => {
      row.classList.toggle("current", b === current);
      row.classList.toggle("done", steps[b] > 0 && b !== current);
      const n = `${steps[b]} forward${steps[b] === 1 ? "" : "s"}`;
      status.textContent = b === current ? `denoising\n${n}` : steps[b] > 0 ? `✓ ${n}` : end ? "not needed" : "waiting";
    });
    const masked = model.maskedAfter(k);
    this.root.setAttribute("aria-label", `Answer canvas after forward ${k} of ${model.length}: `
      + `${model.answerLen - masked} of ${model.answerLen} positions committed, ${masked} masked`
      + (current >= 0 ? `, block ${current} being denoised.` : "."));
  }

  _cell(model, p, k, end, byForward) {
    const f = model.committedAt[p];
    const cell = this.cells[p];
    const beyond = p >= model.maxTokens;
    let look, text, cls, colour = "", title;
    if (f === 0 || f > k) {
      const skipped = end;           // never committed and the request is over: its block never ran
      look = skipped ? "skipped" : "masked";
      text = skipped ? "" : "░";
      cls = "cell " + look;
      title = `position ${p} · block ${model.blockOf(p)} · ` + (skipped ? "never decoded: the answer ended earlier"
        : "masked");
    } else {
      const now = model.tokenAt(p, k);
      const shown = cellText(now.text, model.isStop(p, k));
      const fw = model.forwards[f - 1];
      colour = forwardColour(f, k);
      text = byForward ? String(f) : shown.text;
      cls = `cell committed ${shown.kind}` + ((f === k || now.editedAt === k) && !end ? " new" : "")
        + (now.edits ? " edited" : "");
      look = `${f}/${k}/${text}/${cls}`;
      title = `position ${p} · block ${fw.block} · committed at forward ${f} (its block's forward ${fw.step + 1}) · `
        + `token ${JSON.stringify(now.text)} (id ${now.id})`
        + (now.edits ? ` · rewritten ${now.edits}× by token editing, last at forward ${now.editedAt}` : "");
    }
    if (beyond) {
      cls += " beyond";
      title += " · past max_tokens: decoded, not returned";
    }
    if (this.looks[p] === look + beyond) return;
    this.looks[p] = look + beyond;
    cell.className = cls;
    cell.textContent = text;
    cell.title = title;
    cell.style.backgroundColor = colour;
    cell.style.color = colour ? inkFor(colour) : "";
  }
}

// The legend: every colour and sign of the canvas in words.
export function drawLegend(root, k, {beyond = false, skipped = false} = {}) {
  const n = Math.max(k, 1);
  const ramp = [1, Math.ceil(n / 2), n].filter((v, i, a) => a.indexOf(v) === i)
    .map(f => `<span class="chip" data-bg="${forwardColour(f, n)}">${f}</span>`).join("");
  root.innerHTML = `
    <span class="item"><span class="ramp">${ramp}</span> committed at forward 1 … ${n} (early → late)</span>
    <span class="item"><span class="chip masked-chip">░</span> masked: not decoded yet</span>
    <span class="item"><span class="chip new-chip">a</span> committed or rewritten by the forward shown</span>
    <span class="item"><span class="chip edited-chip">a</span> rewritten by token editing (tooltip: how often)</span>
    <span class="item"><span class="chip">∎</span> end of answer (EOS / end of turn)</span>
    <span class="item"><span class="chip">␣</span> space · <span class="chip">↵</span> newline ·
      <span class="chip">·</span> part of a multi-byte character</span>
    <span class="item"><span class="chip current-chip">&nbsp;</span> block being denoised</span>`
    + (skipped ? `<span class="item"><span class="chip skipped-chip">&nbsp;</span> never decoded: the answer ended
      in an earlier block</span>` : "")
    + (beyond ? `<span class="item"><span class="chip beyond">a</span> past max_tokens: decoded, not returned</span>`
      : "");
  for (const chip of root.querySelectorAll("[data-bg]")) {   // set through the CSSOM: the CSP forbids inline styles
    chip.style.backgroundColor = chip.getAttribute("data-bg");
    chip.style.color = inkFor(chip.getAttribute("data-bg"));
    chip.removeAttribute("data-bg");
  }
}
