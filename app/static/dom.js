// Small DOM helpers shared by the drawing modules.

export const SVG_NS = "http://www.w3.org/2000/svg";
export const WORD_START = "\u2581"; // SentencePiece's word-start marker

export function svgEl(tag, attrs = {}, parent = null) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

export function htmlEl(tag, attrs = {}, text = null) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  if (text !== null) el.textContent = text;
  return el;
}

const measureCtx = document.createElement("canvas").getContext("2d");

export function textWidth(text, font) {
  measureCtx.font = font;
  return measureCtx.measureText(text).width;
}

/** A token split for display: whether it starts a word (SentencePiece "▁") and its text. */
export function splitToken(token) {
  if (token.startsWith(WORD_START) && token.length > 1) return { wordStart: true, text: token.slice(1) };
  return { wordStart: false, text: token };
}

export function truncate(text, max = 14) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Fill an SVG <text> with a token: a faint "▁" before word-initial pieces, then the text. */
export function fillTokenText(textEl, token, max = 14) {
  const { wordStart, text } = splitToken(token);
  textEl.textContent = "";
  if (wordStart) svgEl("tspan", { class: "ws-mark" }, textEl).textContent = WORD_START;
  textEl.appendChild(document.createTextNode(truncate(text, max)));
  svgEl("title", {}, textEl).textContent = token;
}

/** The visible length of a token's label, in characters, as fillTokenText draws it. */
export function labelText(token, max = 14) {
  const { wordStart, text } = splitToken(token);
  return (wordStart ? WORD_START : "") + truncate(text, max);
}

/** A piece list back to readable text (for permalinks, where the request text is unknown). */
export function detokenise(tokens) {
  const words = tokens.filter((t) => t !== "</s>");
  if (words.some((t) => t.startsWith(WORD_START))) return words.join("").replaceAll(WORD_START, " ").trim();
  return words.join(" ");
}

export function formatWeight(w) {
  return w.toFixed(3);
}
