// The hard alignment as a picture: source tokens in a line on top, target tokens below,
// a line from each target token to the source token it attends to most.

import { fillTokenText, labelText, svgEl, textWidth } from "./dom.js";

const FONT = "13px system-ui, -apple-system, 'Segoe UI', Roboto, 'Noto Sans', 'DejaVu Sans', sans-serif";
const MAX_CHARS = 18;
const PAD = 7; // inside a token box
const GAP = 6; // between boxes
const BOX_H = 24;
const HEIGHT = 150;
const CAPTION_FONT = "600 11px system-ui, -apple-system, 'Segoe UI', Roboto, 'Noto Sans', 'DejaVu Sans', sans-serif";

export class LinksView {
  constructor(host) {
    this.host = host;
    host.addEventListener("mouseover", (e) => {
      const box = e.target.closest("g[data-side]");
      if (box) this.highlightToken(box.dataset.side, Number(box.dataset.index));
    });
    host.addEventListener("mouseleave", () => this.highlightToken(null));
  }

  render(sourceTokens, targetTokens, links, scaleMax, captions) {
    this.host.textContent = "";
    this.links = links;
    const MARGIN = Math.ceil(Math.max(...captions.map((c) => textWidth(c.toUpperCase(), CAPTION_FONT) * 1.1))) + 14;
    const place = (tokens) => {
      let x = 0;
      return tokens.map((tok) => {
        const w = Math.ceil(textWidth(labelText(tok, MAX_CHARS), FONT)) + 2 * PAD;
        const box = { x, w, mid: x + w / 2 };
        x += w + GAP;
        return box;
      });
    };
    const src = place(sourceTokens);
    const tgt = place(targetTokens);
    const rowWidth = (boxes) => (boxes.length ? boxes[boxes.length - 1].x + boxes[boxes.length - 1].w : 0);
    const inner = Math.max(rowWidth(src), rowWidth(tgt));
    const shift = (boxes) => {
      const dx = MARGIN + (inner - rowWidth(boxes)) / 2;
      boxes.forEach((b) => {
        b.x += dx;
        b.mid += dx;
      });
    };
    shift(src);
    shift(tgt);
    const width = MARGIN + inner + 8;
    const svg = svgEl("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, class: "links-svg", role: "img" }, this.host);
    svgEl("title", {}, svg).textContent = `Hard alignment: ${links.length} links between ${sourceTokens.length} source and ${targetTokens.length} target tokens`;
    const topY = 4;
    const bottomY = HEIGHT - BOX_H - 4;
    svgEl("text", { x: 0, y: topY + BOX_H / 2, class: "links-caption", "dominant-baseline": "central" }, svg).textContent = captions[0];
    svgEl("text", { x: 0, y: bottomY + BOX_H / 2, class: "links-caption", "dominant-baseline": "central" }, svg).textContent = captions[1];

    const lineGroup = svgEl("g", { class: "link-lines" }, svg);
    this.lines = links.map((link) => {
      const s = src[link.source];
      const t = tgt[link.target];
      const strength = scaleMax > 0 ? Math.min(1, link.weight / scaleMax) : 0;
      return svgEl("line", {
        x1: s.mid, y1: topY + BOX_H + 1, x2: t.mid, y2: bottomY - 1,
        "data-source": link.source, "data-target": link.target, "data-weight": Number(link.weight.toPrecision(6)),
        "stroke-opacity": (0.35 + 0.65 * strength).toFixed(3), "stroke-width": (1.2 + 2.3 * strength).toFixed(2),
      }, lineGroup);
    });

    const drawRow = (tokens, boxes, y, side) =>
      tokens.map((tok, i) => {
        const g = svgEl("g", { class: `token${tok === "</s>" ? " eos" : ""}`, "data-side": side, "data-index": i }, svg);
        svgEl("rect", { x: boxes[i].x, y, width: boxes[i].w, height: BOX_H, rx: 4 }, g);
        const text = svgEl("text", { x: boxes[i].mid, y: y + BOX_H / 2, "text-anchor": "middle", "dominant-baseline": "central" }, g);
        fillTokenText(text, tok, MAX_CHARS);
        return g;
      });
    this.sourceBoxes = drawRow(sourceTokens, src, topY, "source");
    this.targetBoxes = drawRow(targetTokens, tgt, bottomY, "target");
  }

  clearHighlight() {
    for (const g of [...(this.sourceBoxes || []), ...(this.targetBoxes || [])]) g.classList.remove("active");
    for (const line of this.lines || []) line.classList.remove("active", "dim");
  }

  /** Highlight one source column and one target row (from the heatmap), or nothing. */
  highlightCell(cell) {
    if (!this.sourceBoxes) return;
    this.clearHighlight();
    if (!cell) return;
    this.sourceBoxes[cell.col]?.classList.add("active");
    this.targetBoxes[cell.row]?.classList.add("active");
    this.lines.forEach((line, i) => {
      const l = this.links[i];
      const hit = l.target === cell.row || l.source === cell.col;
      line.classList.add(hit ? "active" : "dim");
    });
  }

  /** Hovering a token in the picture: it, its links and the tokens at their other ends. */
  highlightToken(side, index) {
    if (!this.sourceBoxes) return;
    this.clearHighlight();
    if (!side) return;
    (side === "source" ? this.sourceBoxes : this.targetBoxes)[index].classList.add("active");
    this.lines.forEach((line, i) => {
      const l = this.links[i];
      const hit = side === "source" ? l.source === index : l.target === index;
      line.classList.add(hit ? "active" : "dim");
      if (hit) (side === "source" ? this.targetBoxes[l.target] : this.sourceBoxes[l.source]).classList.add("active");
    });
  }
}
