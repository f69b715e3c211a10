// The main heatmap, drawn in SVG: target tokens as rows, source tokens as columns. Every
// cell is a <rect data-row data-col data-weight>. The host element is focusable and moves
// a cursor cell with the arrow keys; hover and cursor share one highlight.

import { colourFor, gradientStops } from "./colors.js";
import { fillTokenText, labelText, svgEl, textWidth } from "./dom.js";

const LABEL_FONT = "12px system-ui, -apple-system, 'Segoe UI', Roboto, 'Noto Sans', 'DejaVu Sans', sans-serif";
const LABEL_MAX_CHARS = 14;
const ANGLE = 55; // degrees the column labels are turned
const MIN_CELL = 16;
const MAX_CELL = 36;

export class Heatmap {
  /**
   * host: the focusable #heatmap element; scroller: its scrolling parent.
   * onHighlight({row, col} | null): called when hover or cursor moves. availableWidth():
   * the width the drawing may take (defaults to the scroller's).
   */
  constructor(host, scroller, { onHighlight, availableWidth, resizeTarget }) {
    this.host = host;
    this.scroller = scroller;
    this.onHighlight = onHighlight;
    this.availableWidth = availableWidth || (() => scroller.clientWidth);
    this.tokens = null;
    this.matrix = null;
    this.cursor = null;
    this.hover = null;
    this.cells = [];
    this.layout = null;

    host.addEventListener("mousemove", (e) => this.onMouse(e));
    host.addEventListener("mouseleave", () => this.setHover(null));
    host.addEventListener("click", (e) => {
      const cell = this.cellFromEvent(e);
      if (cell) this.setCursor(cell.row, cell.col, false);
    });
    host.addEventListener("keydown", (e) => this.onKey(e));
    host.addEventListener("focus", () => {
      if (!this.tokens) return;
      if (!this.cursor) this.setCursor(0, 0);
      else this.emit();
    });
    host.addEventListener("blur", () => this.emit());

    let lastWidth = 0;
    new ResizeObserver(() => {
      const w = this.availableWidth();
      if (this.tokens && Math.abs(w - lastWidth) > 4) {
        lastWidth = w;
        const previous = this.layout && this.layout.cell;
        if (previous !== this.computeLayout().cell) this.build();
      }
    }).observe(resizeTarget || scroller);
  }

  /** New tokens (a new alignment or granularity): rebuild the drawing. */
  setTokens(sourceTokens, targetTokens) {
    this.tokens = { source: sourceTokens, target: targetTokens };
    this.cursor = null;
    this.hover = null;
    this.build();
  }

  /** New weights for the same tokens: recolour in place. links: hard alignment to mark. */
  setMatrix(matrix, scaleMax, links) {
    this.matrix = matrix;
    this.scaleMax = scaleMax;
    this.links = links;
    this.paint();
    this.emit();
  }

  computeLayout() {
    const { source, target } = this.tokens;
    const widths = (tokens) => tokens.map((t) => textWidth(labelText(t, LABEL_MAX_CHARS), LABEL_FONT));
    const srcW = widths(source);
    const tgtW = widths(target);
    const rowLabelW = Math.ceil(Math.max(24, ...tgtW)) + 14;
    const rad = (ANGLE * Math.PI) / 180;
    const colLabelH = Math.ceil(Math.max(24, ...srcW) * Math.sin(rad)) + 16;
    const avail = Math.max(120, this.availableWidth() - rowLabelW - 24);
    // Fit the width; also keep a long target within about one screen (it scrolls beyond that).
    const availH = Math.max(320, window.innerHeight - 340);
    const fit = Math.min(avail / Math.max(source.length, 1), availH / Math.max(target.length, 1));
    const cell = Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(fit)));
    const gridW = cell * source.length;
    const gridH = cell * target.length;
    // Turned labels lean right; leave room for the last ones.
    let right = gridW;
    srcW.forEach((w, c) => {
      right = Math.max(right, (c + 0.5) * cell + w * Math.cos(rad) + 6);
    });
    return {
      cell, gridW, gridH, rowLabelW, colLabelH, rad,
      width: rowLabelW + right + 4,
      height: colLabelH + gridH + 4,
    };
  }

  build() {
    const { source, target } = this.tokens;
    const L = (this.layout = this.computeLayout());
    const { cell } = L;
    this.host.textContent = "";
    const svg = svgEl("svg", {
      width: L.width, height: L.height, viewBox: `0 0 ${L.width} ${L.height}`,
      class: "heatmap-svg", "aria-hidden": "true",
    }, this.host);
    this.svg = svg;

    const colLabels = svgEl("g", { class: "col-labels" }, svg);
    this.colLabels = source.map((tok, c) => {
      const x = L.rowLabelW + (c + 0.5) * cell;
      const y = L.colLabelH - 8;
      const t = svgEl("text", {
        x, y, class: `col-label${tok === "</s>" ? " eos" : ""}`, "data-col": c,
        transform: `rotate(${-ANGLE} ${x} ${y})`,
      }, colLabels);
      fillTokenText(t, tok, LABEL_MAX_CHARS);
      return t;
    });

    const rowLabels = svgEl("g", { class: "row-labels" }, svg);
    this.rowLabels = target.map((tok, r) => {
      const t = svgEl("text", {
        x: L.rowLabelW - 8, y: L.colLabelH + (r + 0.5) * cell, class: `row-label${tok === "</s>" ? " eos" : ""}`,
        "data-row": r, "text-anchor": "end", "dominant-baseline": "central",
      }, rowLabels);
      fillTokenText(t, tok, LABEL_MAX_CHARS);
      return t;
    });

    const grid = svgEl("g", { class: "cells", transform: `translate(${L.rowLabelW} ${L.colLabelH})` }, svg);
    this.grid = grid;
    this.cells = [];
    for (let r = 0; r < target.length; r++) {
      for (let c = 0; c < source.length; c++) {
        this.cells.push(svgEl("rect", {
          x: c * cell, y: r * cell, width: cell, height: cell, "data-row": r, "data-col": c,
        }, grid));
      }
    }
    svgEl("rect", { class: "grid-frame", x: 0, y: 0, width: L.gridW, height: L.gridH }, grid);
    this.dots = svgEl("g", { class: "hard-dots" }, grid);
    const overlay = svgEl("g", { class: "overlay" }, grid);
    this.rowBand = svgEl("rect", { class: "band", x: 0, height: cell, width: L.gridW, visibility: "hidden" }, overlay);
    this.colBand = svgEl("rect", { class: "band", y: 0, width: cell, height: L.gridH, visibility: "hidden" }, overlay);
    this.cursorRect = svgEl("rect", { class: "cursor", width: cell, height: cell, visibility: "hidden" }, overlay);

    this.host.dataset.rows = target.length;
    this.host.dataset.cols = source.length;
    if (this.matrix && this.matrix.length === this.cells.length) this.paint();
    if (this.cursor) {
      this.cursorRect.setAttribute("x", this.cursor.col * cell);
      this.cursorRect.setAttribute("y", this.cursor.row * cell);
    }
    this.emit();
  }

  paint() {
    if (!this.cells.length || !this.matrix || this.matrix.length !== this.cells.length) return;
    const m = this.matrix;
    for (let i = 0; i < m.length; i++) {
      const rect = this.cells[i];
      rect.setAttribute("fill", colourFor(m[i], this.scaleMax));
      rect.setAttribute("data-weight", Number(m[i].toPrecision(6)));
    }
    const cell = this.layout.cell;
    this.dots.textContent = "";
    for (const link of this.links || []) {
      svgEl("circle", {
        cx: (link.source + 0.5) * cell, cy: (link.target + 0.5) * cell, r: Math.max(2.5, cell * 0.14),
        "data-row": link.target, "data-source": link.source,
      }, this.dots);
    }
  }

  cellFromEvent(e) {
    const rect = e.target.closest && e.target.closest("rect[data-row][data-col]");
    if (!rect) return null;
    return { row: Number(rect.dataset.row), col: Number(rect.dataset.col) };
  }

  onMouse(e) {
    const cell = this.cellFromEvent(e);
    if (!cell) {
      this.setHover(null);
      return;
    }
    if (!this.hover || this.hover.row !== cell.row || this.hover.col !== cell.col) this.setHover(cell);
  }

  setHover(cell) {
    this.hover = cell;
    this.emit();
  }

  setCursor(row, col, scroll = true) {
    if (!this.tokens) return;
    const rows = this.tokens.target.length;
    const cols = this.tokens.source.length;
    row = Math.max(0, Math.min(rows - 1, row));
    col = Math.max(0, Math.min(cols - 1, col));
    this.cursor = { row, col };
    const cell = this.layout.cell;
    this.cursorRect.setAttribute("x", col * cell);
    this.cursorRect.setAttribute("y", row * cell);
    this.host.dataset.cursorRow = row;
    this.host.dataset.cursorCol = col;
    if (scroll) this.cells[row * cols + col].scrollIntoView({ block: "nearest", inline: "nearest" });
    this.emit();
  }

  onKey(e) {
    if (!this.tokens) return;
    const cur = this.cursor || { row: 0, col: 0 };
    const rows = this.tokens.target.length;
    const cols = this.tokens.source.length;
    const moves = {
      ArrowUp: [cur.row - 1, cur.col],
      ArrowDown: [cur.row + 1, cur.col],
      ArrowLeft: [cur.row, cur.col - 1],
      ArrowRight: [cur.row, cur.col + 1],
      Home: [cur.row, 0],
      End: [cur.row, cols - 1],
      PageUp: [0, cur.col],
      PageDown: [rows - 1, cur.col],
    };
    if (e.key === "Escape") {
      this.cursor = null;
      this.cursorRect.setAttribute("visibility", "hidden");
      delete this.host.dataset.cursorRow;
      delete this.host.dataset.cursorCol;
      this.emit();
      e.preventDefault();
      return;
    }
    const to = moves[e.key];
    if (!to) return;
    e.preventDefault();
    this.hover = null;
    this.setCursor(to[0], to[1]);
  }

  /** The cell to highlight: the hovered one, else the cursor while the map has focus. */
  active() {
    if (this.hover) return { ...this.hover, via: "pointer" };
    if (this.cursor && document.activeElement === this.host) return { ...this.cursor, via: "keyboard" };
    return null;
  }

  emit() {
    if (!this.tokens || !this.layout) return;
    const a = this.active();
    const cell = this.layout.cell;
    this.rowLabels.forEach((t) => t.classList.remove("active"));
    this.colLabels.forEach((t) => t.classList.remove("active"));
    const showCursor = this.cursor && document.activeElement === this.host;
    this.cursorRect.setAttribute("visibility", showCursor ? "visible" : "hidden");
    if (a) {
      this.rowLabels[a.row].classList.add("active");
      this.colLabels[a.col].classList.add("active");
      this.rowBand.setAttribute("y", a.row * cell);
      this.colBand.setAttribute("x", a.col * cell);
      this.rowBand.setAttribute("visibility", "visible");
      this.colBand.setAttribute("visibility", "visible");
      this.host.dataset.activeRow = a.row;
      this.host.dataset.activeCol = a.col;
    } else {
      this.rowBand.setAttribute("visibility", "hidden");
      this.colBand.setAttribute("visibility", "hidden");
      delete this.host.dataset.activeRow;
      delete this.host.dataset.activeCol;
    }
    this.onHighlight(a);
  }
}

/** The colour legend: a gradient bar with ticks from 0 to scaleMax. */
export function drawLegend(host, scaleMax, relative) {
  host.textContent = "";
  const width = 220;
  const x0 = 20;
  const svg = svgEl("svg", { width: width + 2 * x0, height: 42, viewBox: `0 0 ${width + 2 * x0} 42`, role: "img" }, host);
  svgEl("title", {}, svg).textContent = `Colour scale: light is 0, dark is ${scaleMax.toFixed(2)}`;
  const id = "legend-gradient";
  const defs = svgEl("defs", {}, svg);
  const grad = svgEl("linearGradient", { id, x1: 0, x2: 1, y1: 0, y2: 0 }, defs);
  for (const stop of gradientStops(17)) svgEl("stop", { offset: stop.offset, "stop-color": stop.colour }, grad);
  svgEl("text", { x: 0, y: 12, class: "legend-title" }, svg).textContent = relative ? "Weight (0 to max shown)" : "Weight";
  svgEl("rect", { x: x0, y: 17, width, height: 10, fill: `url(#${id})`, class: "legend-bar" }, svg);
  const ticks = 4;
  for (let i = 0; i <= ticks; i++) {
    const x = x0 + (i / ticks) * width;
    svgEl("line", { x1: x, x2: x, y1: 27, y2: 30, class: "legend-tick" }, svg);
    const label = svgEl("text", { x, y: 39, class: "legend-label", "text-anchor": "middle" }, svg);
    label.textContent = ((i / ticks) * scaleMax).toFixed(scaleMax < 0.1 ? 3 : 2);
  }
  host.dataset.max = scaleMax;
}
