// The small chart beside the canvas: positions committed by each forward, one bar per forward in
// the canvas's colours, dashed lines where a new block starts. Plain SVG, redrawn whole (a few
// hundred bars at most).
import {forwardColour} from "./view.js";

const W = 600, H = 160, LEFT = 28, BOTTOM = 22, TOP = 14;
const NS = "http://www.w3.org/2000/svg";

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Bars for forwards 1..n (all of the request when replaying), the ones after k greyed.
export function drawChart(svg, model, k) {
  const n = model.length;
  const counts = model.forwards.map(f => f.positions.length);
  const top = Math.max(1, ...counts);
  const plotW = W - LEFT - 6, plotH = H - BOTTOM - TOP;
  const bw = plotW / Math.max(n, 1);
  const y = v => TOP + plotH - (v / top) * plotH;
  const parts = [el("title", {}, "Positions committed per forward"),
                 el("desc", {}, n ? `Forwards 1 to ${n} committed ${counts.join(", ")} positions.` : "No data yet.")];
  parts.push(el("line", {x1: LEFT, y1: y(0), x2: W - 6, y2: y(0), class: "axis"}));
  parts.push(el("line", {x1: LEFT, y1: TOP, x2: LEFT, y2: y(0), class: "axis"}));
  parts.push(el("text", {x: LEFT - 4, y: y(top) + 4, class: "tick", "text-anchor": "end"}, String(top)));
  parts.push(el("text", {x: LEFT - 4, y: y(0), class: "tick", "text-anchor": "end"}, "0"));
  parts.push(el("text", {x: W - 6, y: H - 4, class: "tick", "text-anchor": "end"}, `forward ${n}`));
  parts.push(el("text", {x: LEFT, y: H - 4, class: "tick"}, "forward 1"));
  model.forwards.forEach((f, i) => {
    const x = LEFT + i * bw;
    if (i > 0 && f.block !== model.forwards[i - 1].block) {
      parts.push(el("line", {x1: x, y1: TOP - 10, x2: x, y2: y(0), class: "boundary"}));
      parts.push(el("text", {x: x + 3, y: TOP - 3, class: "tick"}, `block ${f.block}`));
    }
    const fill = i < k ? forwardColour(i + 1, k) : "#d0d0d0";
    const h = Math.max(y(0) - y(counts[i]), counts[i] ? 1 : 0);
    const bar = el("rect", {x: x + bw * 0.1, y: y(0) - h, width: Math.max(bw * 0.8, 0.5), height: h, fill});
    bar.append(el("title", {}, `forward ${i + 1}: ${counts[i]} positions (block ${f.block}, its forward ${f.step + 1})`));
    parts.push(bar);
  });
  if (k > 0 && k <= n) {
    parts.push(el("rect", {x: LEFT + (k - 1) * bw, y: TOP, width: bw, height: plotH, class: "cursor"}));
  }
  svg.replaceChildren(...parts);
}
