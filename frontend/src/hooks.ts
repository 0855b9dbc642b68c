/** Small data-loading hooks. */
import { useCallback, useEffect, useRef, useState } from "react";
import type { Page } from "./api/types";

export interface Loaded<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  reload: () => Promise<void>;
  setData: (update: T | ((prev: T | undefined) => T)) => void;
}

/** Runs `load` when `deps` change; keeps the last data while reloading. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[]): Loaded<T> {
  const [data, setDataState] = useState<T>();
  const [error, setError] = useState<unknown>(null);
  const [loading, setLoading] = useState(true);
  const generation = useRef(0);
  const loadRef = useRef(load);
  loadRef.current = load;

  const reload = useCallback(async () => {
    const mine = ++generation.current;
    setLoading(true);
    try {
      const value = await loadRef.current();
      if (mine === generation.current) {
        setDataState(value);
        setError(null);
      }
    } catch (err) {
      if (mine === generation.current) setError(err);
    } finally {
      if (mine === generation.current) setLoading(false);
    }
  }, []);

  useEffect(() => {
    void reload();
    return () => {
      generation.current += 1;
    };
  }, deps);

  const setData = useCallback((update: T | ((prev: T | undefined) => T)) => {
    setDataState((prev) => (typeof update === "function" ? (update as (p: T | undefined) => T)(prev) : update));
  }, []);

  return { data, error, loading, reload, setData };
}

/** Wraps an action: tracks busy, error and a success message. */
/** A loaded page of decisions: `replace` swaps in an updated item and says what happened. */
export function useDecisionList<T extends { id: string }>(load: () => Promise<Page<T>>, deps: unknown[]) {
  const list = useLoad(load, deps);
  const [message, setMessage] = useState<string | null>(null);
  const { setData } = list;
  const replace = useCallback(
    (updated: T, text: string) => {
      setData((prev) => ({ total: prev?.total ?? 0, items: (prev?.items ?? []).map((r) => (r.id === updated.id ? updated : r)) }));
      setMessage(text);
    },
    [setData],
  );
  return { list, items: list.data?.items ?? [], message, replace };
}

export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [message, setMessage] = useState<string | null>(null);

  const run = useCallback(async <R,>(action: () => Promise<R>, success?: string): Promise<R | undefined> => {
    setBusy(true);
    setError(null);
    setMessage(null);
    try {
      const result = await action();
      if (success) setMessage(success);
      return result;
    } catch (err) {
      setError(err);
      return undefined;
    } finally {
      setBusy(false);
    }
  }, []);

  return { busy, error, message, run, setError, setMessage };
}

export function useDocumentTitle(title: string): void {
  useEffect(() => {
    document.title = title ? `${title} · Nebula` : "Nebula";
  }, [title]);
}

/** Calls `tick` every `ms` while the page is shown (live views that poll the API). */
export function usePoll(tick: () => void, ms: number): void {
  const tickRef = useRef(tick);
  tickRef.current = tick;
  useEffect(() => {
    const timer = setInterval(() => {
      if (typeof document === "undefined" || document.visibilityState !== "hidden") tickRef.current();
    }, ms);
    return () => clearInterval(timer);
  }, [ms]);
}
