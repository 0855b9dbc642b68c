import "@testing-library/jest-dom/vitest";
import { cleanup } from "@testing-library/react";
import { afterEach, vi } from "vitest";

// uPlot draws on a canvas, which jsdom lacks; charts are checked through their text summary.
vi.mock("../components/uplotLoader", () => {
  class FakePlot {
    static instances: FakePlot[] = [];
    data: unknown;
    constructor(_opts: unknown, data: unknown) {
      this.data = data;
      FakePlot.instances.push(this);
    }
    setData(data: unknown) {
      this.data = data;
    }
    setSize() {}
    destroy() {}
  }
  return { loadUPlot: async () => FakePlot };
});

afterEach(() => {
  cleanup();
  document.cookie.split(";").forEach((c) => {
    const name = c.split("=")[0].trim();
    if (name) document.cookie = `${name}=; expires=Thu, 01 Jan 1970 00:00:00 GMT; path=/`;
  });
});
