// The attention viewer page: the translate form, the list of translations, and the views
// of one alignment (heatmap, per-head thumbnails, hard-alignment picture), kept in step
// with the URL (/?alignment=<id>&granularity=&layer=&head=).

import * as api from "./api.js";
import { AttentionData, hardAlignment, maxOf, pharaoh, toRows } from "./matrix.js";
import { Heatmap, drawLegend } from "./heatmap.js";
import { HeadGrid } from "./headgrid.js";
import { LinksView } from "./links.js";
import { detokenise, formatWeight, htmlEl } from "./dom.js";

const $ = (id) => document.getElementById(id);

const state = {
  pairs: [],
  alignmentId: null,
  granularity: "subword",
  layer: "mean",
  head: "mean",
  scale: "absolute", // darkest colour = weight 1; "relative": = the largest weight shown
  payload: null, // the alignment JSON shown now
  data: null, // its AttentionData
  matrix: null,
  links: [],
  scaleMax: 1,
  cache: new Map(), // "id|granularity" -> {payload, data}
  request: 0, // to drop answers that arrive after a newer request
  version: 0, // bumped on every redraw (for tests)
  busy: false,
};

// What tests and the curious can read: the matrix drawn now, and how it was chosen.
window.viewerState = {
  get alignmentId() { return state.alignmentId; },
  get model() { return state.payload ? state.payload.model : null; },
  get granularity() { return state.granularity; },
  get layer() { return state.layer; },
  get head() { return state.head; },
  get scale() { return state.scale; },
  get layers() { return state.data ? state.data.layers : 0; },
  get heads() { return state.data ? state.data.heads : 0; },
  get sourceTokens() { return state.data ? [...state.data.sourceTokens] : []; },
  get targetTokens() { return state.data ? [...state.data.targetTokens] : []; },
  get matrix() { return state.data && state.matrix ? toRows(state.matrix, state.data.rows, state.data.cols) : null; },
  get hardAlignment() { return pharaoh(state.links); },
  get version() { return state.version; },
  get busy() { return state.busy; },
};

// ---------------------------------------------------------------- messages

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  const box = $("error");
  box.textContent = "";
  box.hidden = true;
}

function setBusy(busy, text = "") {
  state.busy = busy;
  document.body.dataset.busy = busy ? "true" : "false";
  $("status").textContent = text;
  $("translate-button").disabled = busy;
}

function actionStatus(text) {
  $("action-status").textContent = text;
}

// ---------------------------------------------------------------- language pairs

function languageName(code) {
  try {
    const names = new Intl.DisplayNames(["en"], { type: "language" });
    const name = names.of(code);
    return name && name !== code ? name : code;
  } catch {
    return code;
  }
}

function fillPairs(pairs) {
  const select = $("pair-select");
  select.textContent = "";
  pairs.forEach((p) => {
    const option = htmlEl("option", { value: p.id, dataset: { source: p.source, target: p.target } },
      `${languageName(p.source)} → ${languageName(p.target)}`);
    option.title = `model ${p.id}`;
    select.appendChild(option);
  });
  select.disabled = pairs.length === 0;
  if (!pairs.length) select.appendChild(htmlEl("option", { value: "" }, "No models served"));
  showLimit();
}

async function loadPairs() {
  try {
    state.pairs = await api.fetchPairs();
    fillPairs(state.pairs);
    if (!state.pairs.length) showError("The service serves no language pair, so nothing can be translated.");
  } catch (err) {
    // Fall back to the API's default pair so the form stays usable.
    state.pairs = [{ id: "en-de", source: "en", target: "de" }];
    fillPairs(state.pairs);
    showError(`Could not load the list of language pairs: ${err.message}`);
  }
}

function showLimit() {
  const option = $("pair-select").selectedOptions[0];
  const pair = option && state.pairs.find((p) => p.id === option.value);
  $("limit-hint").textContent = pair && pair.maxSourceTokens
    ? `The ${pair.id} model reads at most ${pair.maxSourceTokens} subword tokens per sentence.`
    : "";
}

function selectedPair() {
  const option = $("pair-select").selectedOptions[0];
  if (!option || !option.value) return null;
  return { id: option.value, source: option.dataset.source, target: option.dataset.target };
}

// ---------------------------------------------------------------- translating

function readNumber(id) {
  const raw = $(id).value.trim();
  if (raw === "") return null;
  const n = Number(raw);
  return Number.isFinite(n) ? n : raw; // let the service say what is wrong with odd values
}

async function onTranslate(event) {
  event.preventDefault();
  const lines = $("source-text").value.split("\n").map((l) => l.trim()).filter(Boolean);
  if (!lines.length) {
    showError("Enter some text to translate.");
    $("source-text").focus();
    return;
  }
  const pair = selectedPair();
  if (!pair) {
    showError("Choose a language pair first.");
    return;
  }
  const payload = {
    text: lines.length === 1 ? lines[0] : lines,
    source: pair.source,
    target: pair.target,
    beam_size: readNumber("beam-size"),
    n_best: readNumber("n-best"),
    length_penalty: readNumber("length-penalty"),
    max_length: readNumber("max-length"),
    alignments: true,
    include_attention: false,
  };
  // a cleared field means "the service's default", not null
  for (const key of Object.keys(payload)) if (payload[key] === null) delete payload[key];
  setBusy(true, "Translating…");
  let response;
  try {
    response = await api.translate(payload);
  } catch (err) {
    setBusy(false);
    showError(err.message);
    return;
  }
  setBusy(false);
  clearError();
  renderResults(response, lines);
  const first = (response.translations || [])[0];
  if (first && first.alignment_id) {
    await loadAlignment(first.alignment_id, { push: true });
  } else if (first) {
    showError("The service returned no alignment for this translation, so there is no attention to show.");
  }
}

function hypothesesOf(translation) {
  const list = [{ text: translation.text, score: translation.score, alignment_id: translation.alignment_id }];
  for (const alt of translation.alternatives || []) {
    const duplicate = list.some((h) => (alt.alignment_id && h.alignment_id === alt.alignment_id) ||
      (!alt.alignment_id && h.text === alt.text && h.score === alt.score));
    if (!duplicate) list.push(alt);
  }
  return list;
}

function formatScore(score) {
  return typeof score === "number" ? score.toFixed(3).replace("-", "−") : "–";
}

function hypothesisButton(h, rank) {
  const button = htmlEl("button", {
    type: "button",
    class: `hypothesis${rank === 1 ? " best" : ""}`,
    "data-alignment-id": h.alignment_id || "",
    "data-rank": rank,
    "aria-pressed": "false",
    disabled: !h.alignment_id,
    title: h.alignment_id ? "Show this translation's attention" : "No attention stored for this translation",
  });
  button.appendChild(htmlEl("span", { class: "rank", "aria-hidden": "true" }, String(rank)));
  button.appendChild(htmlEl("span", { class: "hyp-text" }, h.text));
  const score = htmlEl("span", { class: "hyp-score", "data-score": h.score }, formatScore(h.score));
  score.setAttribute("aria-label", `score ${formatScore(h.score)}`);
  button.appendChild(score);
  return button;
}

function renderResults(response, inputs) {
  const list = $("result-list");
  list.textContent = "";
  (response.translations || []).forEach((translation, i) => {
    const article = htmlEl("article", { class: "result", "data-index": i });
    if (inputs[i] !== undefined) article.appendChild(htmlEl("p", { class: "source-line" }, inputs[i]));
    const hyps = hypothesesOf(translation);
    const best = hypothesisButton(hyps[0], 1);
    best.classList.add("translation");
    article.appendChild(best);
    if (hyps.length > 1) {
      article.appendChild(htmlEl("p", { class: "alt-title" }, `Alternatives (${hyps.length - 1})`));
      const ol = htmlEl("ol", { class: "alternatives" });
      hyps.slice(1).forEach((h, k) => {
        const li = htmlEl("li");
        li.appendChild(hypothesisButton(h, k + 2));
        ol.appendChild(li);
      });
      article.appendChild(ol);
    }
    list.appendChild(article);
  });
  const t = response.timing || {};
  const parts = [`Model ${response.model ?? "?"}`];
  if (typeof t.compute_ms === "number") parts.push(`${t.compute_ms.toFixed(0)} ms compute`);
  if (typeof t.total_ms === "number") parts.push(`${t.total_ms.toFixed(0)} ms total`);
  $("timing").textContent = parts.join(" · ");
  $("results").hidden = false;
}

/** After a permalink: show what is known of the stored alignment in the results panel. */
function renderStoredResult(payload) {
  if (document.querySelector(`#result-list .hypothesis[data-alignment-id="${CSS.escape(payload.id)}"]`)) return;
  const list = $("result-list");
  list.textContent = "";
  const article = htmlEl("article", { class: "result stored" });
  article.appendChild(htmlEl("p", { class: "source-line" }, detokenise(payload.source_tokens)));
  const button = hypothesisButton({ text: detokenise(payload.target_tokens), score: null, alignment_id: payload.id }, 1);
  button.classList.add("translation");
  article.appendChild(button);
  list.appendChild(article);
  $("timing").textContent = `Stored alignment ${payload.id} · model ${payload.model ?? "?"} (opened from a link)`;
  $("results").hidden = false;
}

function markSelectedHypothesis() {
  for (const b of document.querySelectorAll("#result-list .hypothesis")) {
    b.setAttribute("aria-pressed", b.dataset.alignmentId === state.alignmentId ? "true" : "false");
  }
}

// ---------------------------------------------------------------- alignments

async function getAlignment(id, granularity) {
  const key = `${id}|${granularity}`;
  if (state.cache.has(key)) return state.cache.get(key);
  const payload = await api.fetchAlignment(id, granularity);
  const entry = { payload, data: new AttentionData(payload) };
  state.cache.set(key, entry);
  return entry;
}

/**
 * Show alignment `id` at state.granularity. push: add a history entry (a new alignment);
 * otherwise the URL is replaced. Returns whether it was shown.
 */
async function loadAlignment(id, { push = false, fromUrl = false } = {}) {
  const request = ++state.request;
  const granularity = state.granularity;
  setBusy(true, "Loading attention…");
  let entry;
  try {
    entry = await getAlignment(id, granularity);
  } catch (err) {
    if (request !== state.request) return false;
    setBusy(false);
    const what = err instanceof api.ApiError && err.status === 404
      ? `Alignment “${id}” is not available: ${err.message}`
      : `Could not load alignment “${id}”: ${err.message}`;
    const sentence = /[.!?]$/.test(what) ? what : `${what}.`;
    showError(fromUrl ? `${sentence} Translate the sentence again to get a new link.` : sentence);
    return false;
  }
  if (request !== state.request) return false;
  setBusy(false);
  clearError();
  const sameAlignment = state.alignmentId === id;
  state.alignmentId = id;
  state.payload = entry.payload;
  state.data = entry.data;
  if (state.layer !== "mean" && !(state.layer < state.data.layers)) state.layer = "mean";
  if (state.head !== "mean" && !(state.head < state.data.heads)) state.head = "mean";
  fillLayerHeadSelects();
  $("empty-state").hidden = true;
  $("viewer").hidden = false;
  setControlsEnabled(true);
  heatmap.setTokens(state.data.sourceTokens, state.data.targetTokens);
  if (fromUrl) renderStoredResult(entry.payload);
  markSelectedHypothesis();
  matchPairSelect(entry.payload.model);
  redraw({ push: push && !sameAlignment });
  return true;
}

function matchPairSelect(model) {
  const select = $("pair-select");
  if (model && [...select.options].some((o) => o.value === model)) select.value = model;
  showLimit();
}

function fillLayerHeadSelects() {
  const fill = (select, n, meanLabel, name, value) => {
    select.textContent = "";
    select.appendChild(htmlEl("option", { value: "mean" }, meanLabel));
    for (let i = 0; i < n; i++) select.appendChild(htmlEl("option", { value: String(i) }, `${name} ${i + 1}`));
    select.value = String(value);
  };
  fill($("layer-select"), state.data.layers, `Mean of ${state.data.layers} layers`, "Layer", state.layer);
  fill($("head-select"), state.data.heads, `Mean of ${state.data.heads} heads`, "Head", state.head);
}

function setControlsEnabled(enabled) {
  for (const el of document.querySelectorAll(".toolbar select, .toolbar input")) el.disabled = !enabled;
}

function viewUrl() {
  const params = new URLSearchParams();
  if (state.alignmentId) params.set("alignment", state.alignmentId);
  if (state.granularity !== "subword") params.set("granularity", state.granularity);
  if (state.layer !== "mean") params.set("layer", state.layer);
  if (state.head !== "mean") params.set("head", state.head);
  const query = params.toString();
  return `/${query ? `?${query}` : ""}`;
}

function describeSelection() {
  const d = state.data;
  const layer = state.layer === "mean" ? `mean of ${d.layers} layers` : `layer ${state.layer + 1} of ${d.layers}`;
  const head = state.head === "mean" ? `mean of ${d.heads} heads` : `head ${state.head + 1} of ${d.heads}`;
  return { layer, head };
}

/** Recompute the selected matrix and draw every view of it. */
function redraw({ push = false } = {}) {
  const d = state.data;
  if (!d) return;
  state.matrix = d.matrix(state.layer, state.head);
  state.scaleMax = state.scale === "relative" ? maxOf(state.matrix) || 1 : 1;
  state.links = hardAlignment(state.matrix, d.sourceTokens, d.targetTokens);

  const host = $("heatmap");
  Object.assign(host.dataset, {
    alignmentId: state.alignmentId, granularity: state.granularity,
    layer: String(state.layer), head: String(state.head),
  });
  heatmap.setMatrix(state.matrix, state.scaleMax, state.links);
  drawLegend($("legend"), state.scaleMax, state.scale === "relative");
  headGrid.render(d, state.layer, state.head, state.scale);
  const pair = (state.payload.model || "").split("-");
  links.render(d.sourceTokens, d.targetTokens, state.links, state.scaleMax,
    [pair[0] ? `source · ${pair[0]}` : "source", pair[1] ? `target · ${pair[1]}` : "target"]);
  $("pharaoh-text").textContent = pharaoh(state.links) || "(no links)";

  const { layer, head } = describeSelection();
  $("heads-title").textContent = state.layer === "mean" ? "Heads (mean of layers)" : `Heads of layer ${state.layer + 1}`;
  $("alignment-caption").textContent =
    `${state.payload.model ?? ""} · ${d.rows} target × ${d.cols} source ${state.granularity === "word" ? "words" : "subwords"} · ${layer} · ${head}`;
  host.setAttribute("aria-label",
    `Attention heatmap, ${layer}, ${head}: ${d.rows} target tokens as rows, ${d.cols} source tokens as columns`);
  $("layer-select").value = String(state.layer);
  $("head-select").value = String(state.head);
  $("granularity-" + state.granularity).checked = true;

  const url = viewUrl();
  if (push) history.pushState({ url }, "", url);
  else if (location.pathname + location.search !== url) history.replaceState({ url }, "", url);
  const permalink = $("permalink");
  permalink.href = new URL(url, location.href).href;
  state.version += 1;
  host.dataset.version = state.version;
}

function onHighlight(cell) {
  const readout = $("cell-readout");
  links.highlightCell(cell);
  const inRange = cell && state.data && state.matrix && cell.row < state.data.rows && cell.col < state.data.cols;
  if (!inRange) {
    readout.innerHTML = '<span class="muted">Hover or focus the heatmap to read a weight.</span>';
    delete readout.dataset.weight;
    return;
  }
  const d = state.data;
  const w = state.matrix[cell.row * d.cols + cell.col];
  readout.textContent = "";
  readout.append(
    "Target ", htmlEl("strong", { class: "tok tgt" }, d.targetTokens[cell.row]), ` (row ${cell.row}) attends to source `,
    htmlEl("strong", { class: "tok src" }, d.sourceTokens[cell.col]), ` (column ${cell.col}) with weight `,
    htmlEl("strong", { class: "weight" }, formatWeight(w)),
  );
  readout.dataset.weight = w;
  readout.dataset.row = cell.row;
  readout.dataset.col = cell.col;
}

// ---------------------------------------------------------------- export

async function copyText(text, label) {
  $("copy-fallback").hidden = true;
  try {
    if (!navigator.clipboard || !window.isSecureContext) throw new Error("no clipboard access");
    await navigator.clipboard.writeText(text);
    actionStatus(`${label} copied to the clipboard.`);
  } catch {
    const box = $("copy-fallback-text");
    box.value = text;
    $("copy-fallback").hidden = false;
    box.focus();
    box.select();
    actionStatus(`Copying was not allowed: copy the ${label.toLowerCase()} from the box below.`);
  }
}

function downloadJson() {
  if (!state.payload) return;
  const { layer, head } = describeSelection();
  const out = {
    ...state.payload,
    view: {
      layer: state.layer,
      head: state.head,
      description: `${layer}, ${head}`,
      matrix: toRows(state.matrix, state.data.rows, state.data.cols),
      hard_alignment: pharaoh(state.links),
    },
  };
  const blob = new Blob([JSON.stringify(out)], { type: "application/json" });
  const url = URL.createObjectURL(blob);
  const a = htmlEl("a", { href: url, download: `alignment-${state.alignmentId}-${state.granularity}.json` });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
  actionStatus("Download started.");
}

// ---------------------------------------------------------------- URL

function readUrl() {
  const params = new URLSearchParams(location.search);
  const num = (v) => (v === null || v === "mean" || !/^\d+$/.test(v) ? "mean" : Number(v));
  return {
    alignment: params.get("alignment"),
    granularity: params.get("granularity") === "word" ? "word" : "subword",
    layer: num(params.get("layer")),
    head: num(params.get("head")),
  };
}

async function applyUrl({ fromUrl }) {
  const view = readUrl();
  state.granularity = view.granularity;
  state.layer = view.layer;
  state.head = view.head;
  $("granularity-" + state.granularity).checked = true;
  if (view.alignment) {
    if (view.alignment === state.alignmentId && state.cache.has(`${view.alignment}|${state.granularity}`)) {
      const entry = state.cache.get(`${view.alignment}|${state.granularity}`);
      if (entry.data !== state.data) {
        state.payload = entry.payload;
        state.data = entry.data;
        heatmap.setTokens(state.data.sourceTokens, state.data.targetTokens);
      }
      fillLayerHeadSelects();
      redraw();
    } else {
      await loadAlignment(view.alignment, { fromUrl });
    }
  }
}

// ---------------------------------------------------------------- wiring

const matrixArea = document.querySelector(".matrix-area");
const heatmap = new Heatmap($("heatmap"), document.querySelector(".heatmap-scroll"), {
  onHighlight,
  resizeTarget: matrixArea,
  // The head thumbnails sit beside the heatmap on wide screens and below it on narrow ones.
  availableWidth() {
    const heads = document.querySelector(".heads");
    const beside = getComputedStyle(matrixArea).flexDirection === "row";
    return matrixArea.clientWidth - (beside ? heads.offsetWidth + 18 : 0);
  },
});
const headGrid = new HeadGrid($("head-grid"), {
  onSelect(head) {
    state.head = head;
    redraw();
  },
});
const links = new LinksView($("links"));

function wire() {
  $("translate-form").addEventListener("submit", onTranslate);
  $("pair-select").addEventListener("change", showLimit);
  $("source-text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("translate-form").requestSubmit();
  });
  $("beam-size").addEventListener("input", () => {
    const beam = Number($("beam-size").value);
    if (Number.isInteger(beam) && beam > 0) $("n-best").max = String(beam);
  });
  $("result-list").addEventListener("click", (e) => {
    const button = e.target.closest(".hypothesis[data-alignment-id]");
    if (button && button.dataset.alignmentId && button.dataset.alignmentId !== state.alignmentId) {
      loadAlignment(button.dataset.alignmentId, { push: true });
    }
  });
  $("layer-select").addEventListener("change", (e) => {
    state.layer = e.target.value === "mean" ? "mean" : Number(e.target.value);
    redraw();
  });
  $("head-select").addEventListener("change", (e) => {
    state.head = e.target.value === "mean" ? "mean" : Number(e.target.value);
    redraw();
  });
  $("scale-select").addEventListener("change", (e) => {
    state.scale = e.target.value;
    redraw();
  });
  for (const radio of document.querySelectorAll('input[name="granularity"]')) {
    radio.addEventListener("change", async (e) => {
      const previous = state.granularity;
      state.granularity = e.target.value;
      if (!state.alignmentId) return;
      const ok = await loadAlignment(state.alignmentId);
      if (!ok) {
        state.granularity = previous;
        $("granularity-" + previous).checked = true;
      }
    });
  }
  $("copy-pharaoh").addEventListener("click", () => copyText(pharaoh(state.links), "Pharaoh alignment"));
  $("copy-permalink").addEventListener("click", () => copyText($("permalink").href, "Link"));
  $("download-json").addEventListener("click", downloadJson);
  window.addEventListener("popstate", () => applyUrl({ fromUrl: true }));
}

async function main() {
  setControlsEnabled(false);
  wire();
  const pairs = loadPairs();
  if (readUrl().alignment) await applyUrl({ fromUrl: true });
  await pairs;
  if (state.payload) matchPairSelect(state.payload.model);
  document.body.dataset.ready = "true";
}

main();
