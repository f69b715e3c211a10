// A single-hue sequential colour ramp (near-white to deep blue) made in OKLCH, so that
// lightness falls evenly with the weight: equal steps in weight look like equal steps.

const HUE = 252; // degrees: blue
const STEPS = 256;

function toSrgbChannel(x) {
  const c = Math.min(1, Math.max(0, x));
  const v = c <= 0.0031308 ? 12.92 * c : 1.055 * Math.pow(c, 1 / 2.4) - 0.055;
  return Math.round(v * 255);
}

/** OKLCH (L 0..1, chroma, hue in degrees) to an sRGB [r, g, b] triple of 0..255. */
export function oklchToRgb(L, C, hueDeg) {
  const h = (hueDeg * Math.PI) / 180;
  const a = C * Math.cos(h);
  const b = C * Math.sin(h);
  const l = (L + 0.3963377774 * a + 0.2158037573 * b) ** 3;
  const m = (L - 0.1055613458 * a - 0.0638541728 * b) ** 3;
  const s = (L - 0.0894841775 * a - 1.291485548 * b) ** 3;
  return [
    toSrgbChannel(4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s),
    toSrgbChannel(-1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s),
    toSrgbChannel(-0.0041960863 * l - 0.7034186147 * m + 1.707614701 * s),
  ];
}

function rampColour(t) {
  const L = 0.975 - 0.685 * t; // lightness falls linearly
  const C = 0.012 + 0.125 * Math.sin(Math.PI * Math.min(1, t * 1.05) * 0.9); // most colourful in the middle
  const hue = HUE + 8 * t; // a touch towards indigo at the dark end
  const [r, g, b] = oklchToRgb(L, C, hue);
  return `rgb(${r} ${g} ${b})`;
}

const LUT = Array.from({ length: STEPS }, (_, i) => rampColour(i / (STEPS - 1)));

/** Colour for a weight, given the weight that maps to the darkest colour. */
export function colourFor(weight, scaleMax = 1) {
  const t = scaleMax > 0 ? weight / scaleMax : 0;
  const i = Math.round(Math.min(1, Math.max(0, t)) * (STEPS - 1));
  return LUT[i];
}

/** Whether text drawn on this weight's colour should be light. */
export function isDark(weight, scaleMax = 1) {
  return scaleMax > 0 && weight / scaleMax > 0.55;
}

export function gradientStops(n = 11) {
  return Array.from({ length: n }, (_, i) => ({ offset: i / (n - 1), colour: LUT[Math.round((i / (n - 1)) * (STEPS - 1))] }));
}
