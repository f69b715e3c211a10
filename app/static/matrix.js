// The 4-D attention array [layer][head][target][source] of one alignment, kept flat, and
// what the page derives from it: means over heads and/or layers, and hard alignments.

export const EOS = "</s>";

export class AttentionData {
  /** payload: the JSON of GET /v1/alignments/{id} (full array, no layer/head reduction). */
  constructor(payload) {
    const { attention, source_tokens: src, target_tokens: tgt } = payload;
    if (!Array.isArray(attention) || !Array.isArray(src) || !Array.isArray(tgt)) {
      throw new Error("The alignment has no attention array or no token lists.");
    }
    this.sourceTokens = src;
    this.targetTokens = tgt;
    this.layers = attention.length;
    this.heads = this.layers ? attention[0].length : 0;
    this.rows = tgt.length;
    this.cols = src.length;
    const size = this.rows * this.cols;
    if (!this.layers || !this.heads || !size) throw new Error("The alignment is empty.");
    this.size = size;
    this.data = new Float32Array(this.layers * this.heads * size);
    let k = 0;
    for (let l = 0; l < this.layers; l++) {
      if (!Array.isArray(attention[l]) || attention[l].length !== this.heads) throw shapeError(payload, l);
      for (let h = 0; h < this.heads; h++) {
        const m = attention[l][h];
        if (!Array.isArray(m) || m.length !== this.rows) throw shapeError(payload, l, h);
        for (let t = 0; t < this.rows; t++) {
          const row = m[t];
          if (!Array.isArray(row) || row.length !== this.cols) throw shapeError(payload, l, h);
          for (let s = 0; s < this.cols; s++) this.data[k++] = Number(row[s]) || 0;
        }
      }
    }
    this.cache = new Map();
  }

  slice(layer, head) {
    const start = (layer * this.heads + head) * this.size;
    return this.data.subarray(start, start + this.size);
  }

  /** T*S matrix (row-major) for layer/head, each an index or "mean"; memoised. */
  matrix(layer, head) {
    const key = `${layer}/${head}`;
    let m = this.cache.get(key);
    if (m) return m;
    const layers = layer === "mean" ? range(this.layers) : [layer];
    const heads = head === "mean" ? range(this.heads) : [head];
    if (layers.length === 1 && heads.length === 1) {
      m = this.slice(layers[0], heads[0]);
    } else {
      m = new Float32Array(this.size);
      for (const l of layers) for (const h of heads) {
        const part = this.slice(l, h);
        for (let i = 0; i < this.size; i++) m[i] += part[i];
      }
      const n = layers.length * heads.length;
      for (let i = 0; i < this.size; i++) m[i] /= n;
    }
    this.cache.set(key, m);
    return m;
  }
}

function shapeError(payload, l, h) {
  const where = h === undefined ? `layer ${l}` : `layer ${l}, head ${h}`;
  return new Error(`The alignment's attention array does not match its tokens (${payload.target_tokens.length} target x ` +
    `${payload.source_tokens.length} source) at ${where}.`);
}

export function range(n) {
  return Array.from({ length: n }, (_, i) => i);
}

export function maxOf(matrix) {
  let max = 0;
  for (const v of matrix) if (v > max) max = v;
  return max;
}

/**
 * Hard alignment of a T*S matrix: for every target token but </s>, the source token (but
 * </s>) with the largest weight. Returns [{source, target, weight}] in target order.
 */
export function hardAlignment(matrix, sourceTokens, targetTokens) {
  const S = sourceTokens.length;
  const links = [];
  targetTokens.forEach((tok, t) => {
    if (tok === EOS) return;
    let best = -1;
    let bestWeight = -Infinity;
    for (let s = 0; s < S; s++) {
      if (sourceTokens[s] === EOS) continue;
      const w = matrix[t * S + s];
      if (w > bestWeight) {
        bestWeight = w;
        best = s;
      }
    }
    if (best >= 0) links.push({ source: best, target: t, weight: bestWeight });
  });
  return links;
}

/** Pharaoh format: "source-target" index pairs, space-separated. */
export function pharaoh(links) {
  return links.map((l) => `${l.source}-${l.target}`).join(" ");
}

/** Rows of plain arrays (for window.viewerState and the JSON download). */
export function toRows(matrix, rows, cols, digits = 6) {
  const out = [];
  for (let t = 0; t < rows; t++) {
    const row = [];
    for (let s = 0; s < cols; s++) row.push(Number(matrix[t * cols + s].toPrecision(digits)));
    out.push(row);
  }
  return out;
}
