/** Formatting helpers shared by the pages. */

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return "—";
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${UNITS[unit]}`;
}

export function formatDate(value: string | null | undefined): string {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return value;
  return date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

export function formatNumber(value: number | null | undefined, digits = 3): string {
  if (value === null || value === undefined || !Number.isFinite(value)) return "—";
  if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString();
  return Number(value.toPrecision(digits)).toString();
}

/** Progress as a percentage 0..100; the API sends a fraction 0..1 (a value above 1 is read as a percentage). */
export function progressPercent(progress: number | null | undefined, step?: number, totalSteps?: number): number {
  let pct: number;
  if (typeof progress === "number" && Number.isFinite(progress)) {
    pct = progress > 1 ? progress : progress * 100;
  } else if (step !== undefined && totalSteps) {
    pct = (step / totalSteps) * 100;
  } else {
    pct = 0;
  }
  return Math.max(0, Math.min(100, pct));
}

export function shortId(id: string | null | undefined, length = 8): string {
  if (!id) return "—";
  return id.length > length ? id.slice(0, length) : id;
}

/** Days until a date (negative when past). */
export function daysUntil(value: string | null | undefined, now: Date = new Date()): number | null {
  if (!value) return null;
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return null;
  return Math.floor((date.getTime() - now.getTime()) / 86_400_000);
}

export function isPast(value: string | null | undefined, now: Date = new Date()): boolean {
  if (!value) return false;
  const date = new Date(value);
  return !Number.isNaN(date.getTime()) && date.getTime() < now.getTime();
}

export const TERMINAL_STATUSES = new Set(["succeeded", "failed", "cancelled"]);
