// Small multiples: one thumbnail heatmap per head of the chosen layer (and their mean),
// drawn on canvas; each is a button that selects its head.

import { colourFor } from "./colors.js";
import { htmlEl } from "./dom.js";

const THUMB = 84; // CSS pixels of a thumbnail's longer side

export class HeadGrid {
  constructor(host, { onSelect }) {
    this.host = host;
    this.onSelect = onSelect;
    host.addEventListener("click", (e) => {
      const button = e.target.closest("button[data-head]");
      if (!button) return;
      const head = button.dataset.head;
      this.onSelect(head === "mean" ? "mean" : Number(head));
    });
  }

  /** data: AttentionData; layer: index or "mean"; selected: head index or "mean". */
  render(data, layer, selected, scaleMode) {
    this.host.textContent = "";
    const heads = ["mean", ...Array.from({ length: data.heads }, (_, h) => h)];
    const matrices = heads.map((h) => data.matrix(layer, h));
    let shared = 1;
    if (scaleMode === "relative") {
      shared = 0;
      for (const m of matrices) for (const v of m) if (v > shared) shared = v;
    }
    const k = THUMB / Math.max(data.rows, data.cols);
    const w = Math.max(8, Math.round(data.cols * k));
    const h = Math.max(8, Math.round(data.rows * k));
    const dpr = window.devicePixelRatio || 1;
    heads.forEach((head, i) => {
      const isSelected = head === selected;
      const name = head === "mean" ? "Mean" : `Head ${head + 1}`;
      const button = htmlEl("button", {
        type: "button", class: `head-thumb${head === "mean" ? " mean" : ""}`, "data-head": head,
        "aria-pressed": isSelected ? "true" : "false", title: `Show ${name.toLowerCase()}`,
      });
      const canvas = htmlEl("canvas", { width: Math.round(w * dpr), height: Math.round(h * dpr), "aria-hidden": "true" });
      canvas.style.width = `${w}px`;
      canvas.style.height = `${h}px`;
      const ctx = canvas.getContext("2d");
      const m = matrices[i];
      const cw = (w * dpr) / data.cols;
      const ch = (h * dpr) / data.rows;
      for (let r = 0; r < data.rows; r++) {
        for (let c = 0; c < data.cols; c++) {
          ctx.fillStyle = colourFor(m[r * data.cols + c], shared);
          // overlap by a pixel fraction so no seams show between cells
          ctx.fillRect(Math.floor(c * cw), Math.floor(r * ch), Math.ceil(cw) + 1, Math.ceil(ch) + 1);
        }
      }
      button.appendChild(canvas);
      button.appendChild(htmlEl("span", { class: "head-name" }, name));
      this.host.appendChild(button);
    });
  }
}
