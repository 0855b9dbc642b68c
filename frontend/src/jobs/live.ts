/** Live job state: server-sent events, with polling every 2 s when the stream fails. */
import { useCallback, useEffect, useRef, useState } from "react";
import { jobs } from "../api/endpoints";
import type { Job, JobEvent, JobMetrics, SeriesPoint } from "../api/types";
import { TERMINAL_STATUSES } from "../format";

export type SeriesMap = Record<string, SeriesPoint[]>;
export type LiveMode = "connecting" | "stream" | "polling" | "done";

export const POLL_INTERVAL_MS = 2000;
/** The server sends `event: status`; unnamed "message" events are read the same way. */
const EVENT_NAMES = ["status"];
/**
 * New metric values in an event trigger one fetch of the series, at most this often. Points come
 * from GET /jobs/{id}/metrics, never from the event: roles report at their own pace, so an
 * event's `step` (the job's) is not the step its metric values belong to.
 */
export const SERIES_REFRESH_MS = 1000;

function isPointList(value: unknown): value is SeriesPoint[] {
  return Array.isArray(value) && value.every((p) => Array.isArray(p) && p.length >= 2);
}

/** The API's series by name (`role.metric`), as numbers; anything that is not a point list is dropped. */
export function flattenSeries(metrics: JobMetrics | undefined | null): SeriesMap {
  const out: SeriesMap = {};
  for (const [name, value] of Object.entries(metrics?.series ?? {})) {
    if (isPointList(value)) out[name] = value.map(([s, v]) => [Number(s), Number(v)] as SeriesPoint);
  }
  return out;
}

export function applyEvent(job: Job | undefined, event: JobEvent): Job | undefined {
  if (!job) return job;
  const next: Job = { ...job };
  if (event.status) next.status = event.status;
  if (typeof event.progress === "number") next.progress = event.progress;
  if (typeof event.step === "number") next.step = event.step;
  if (typeof event.total_steps === "number") next.total_steps = event.total_steps;
  if (event.metrics) next.metrics = { ...(job.metrics ?? {}), ...event.metrics };
  if (event.error !== undefined) next.error = event.error;
  return next;
}

export function parseEvent(data: string): JobEvent | null {
  try {
    const parsed = JSON.parse(data) as unknown;
    return parsed && typeof parsed === "object" ? (parsed as JobEvent) : null;
  } catch {
    return null;
  }
}

export interface LiveJob {
  job: Job | undefined;
  series: SeriesMap;
  error: unknown;
  mode: LiveMode;
  reload: () => Promise<void>;
}

export function useLiveJob(id: string): LiveJob {
  const [job, setJob] = useState<Job>();
  const [series, setSeries] = useState<SeriesMap>({});
  const [error, setError] = useState<unknown>(null);
  const [mode, setMode] = useState<LiveMode>("connecting");
  const source = useRef<EventSource | null>(null);
  const timer = useRef<ReturnType<typeof setInterval> | null>(null);
  const seriesTimer = useRef<ReturnType<typeof setTimeout> | null>(null);
  const alive = useRef(true);

  const stop = useCallback(() => {
    source.current?.close();
    source.current = null;
    if (timer.current) clearInterval(timer.current);
    timer.current = null;
    if (seriesTimer.current) clearTimeout(seriesTimer.current);
    seriesTimer.current = null;
  }, []);

  const refreshSeries = useCallback(() => {
    if (seriesTimer.current) return;
    seriesTimer.current = setTimeout(() => {
      seriesTimer.current = null;
      jobs
        .metrics(id)
        .then((m) => {
          if (alive.current) setSeries(flattenSeries(m));
        })
        .catch(() => undefined);
    }, SERIES_REFRESH_MS);
  }, [id]);

  const fetchAll = useCallback(async () => {
    const [j, m] = await Promise.all([jobs.get(id), jobs.metrics(id).catch(() => undefined)]);
    if (!alive.current) return j;
    setJob(j);
    if (m) setSeries(flattenSeries(m));
    setError(null);
    return j;
  }, [id]);

  const startPolling = useCallback(() => {
    if (timer.current) return;
    setMode("polling");
    timer.current = setInterval(async () => {
      try {
        const j = await fetchAll();
        if (TERMINAL_STATUSES.has(j.status)) {
          stop();
          if (alive.current) setMode("done");
        }
      } catch (err) {
        if (alive.current) setError(err);
      }
    }, POLL_INTERVAL_MS);
  }, [fetchAll, stop]);

  useEffect(() => {
    alive.current = true;
    setJob(undefined);
    setSeries({});
    setMode("connecting");

    async function start() {
      let first: Job;
      try {
        first = await fetchAll();
      } catch (err) {
        if (alive.current) setError(err);
        return;
      }
      if (!alive.current) return;
      if (TERMINAL_STATUSES.has(first.status)) {
        setMode("done");
        return;
      }
      if (typeof EventSource === "undefined") {
        startPolling();
        return;
      }
      const es = new EventSource(jobs.eventsUrl(id), { withCredentials: true });
      source.current = es;
      const onData = (message: MessageEvent) => {
        const event = parseEvent(typeof message.data === "string" ? message.data : "");
        if (!event || !alive.current) return;
        setMode("stream");
        setJob((prev) => applyEvent(prev, event));
        if (event.status && TERMINAL_STATUSES.has(event.status)) {
          stop();
          setMode("done");
          // The final numbers and the complete series come from the API itself.
          void fetchAll().catch(() => undefined);
        } else if (event.metrics && Object.keys(event.metrics).length) {
          refreshSeries();
        }
      };
      es.onopen = () => alive.current && setMode("stream");
      es.onmessage = onData;
      for (const name of EVENT_NAMES) es.addEventListener(name, onData as EventListener);
      es.onerror = () => {
        // The browser would retry forever; poll instead, as the contract allows.
        es.close();
        if (source.current === es) source.current = null;
        if (alive.current) startPolling();
      };
    }

    void start();
    return () => {
      alive.current = false;
      stop();
    };
  }, [id, fetchAll, startPolling, stop, refreshSeries]);

  const reload = useCallback(async () => {
    try {
      await fetchAll();
    } catch (err) {
      setError(err);
    }
  }, [fetchAll]);

  return { job, series, error, mode, reload };
}
