/** Loads uPlot on demand, so that its code ships in its own chunk and only with a chart. */
import type uPlot from "uplot";

export type UPlotConstructor = typeof uPlot;

export async function loadUPlot(): Promise<UPlotConstructor> {
  return (await import("uplot")).default;
}
