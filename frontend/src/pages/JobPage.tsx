/** One job, live: progress, charts of loss, throughput and bytes per direction, cancel, artifacts. */
import { useMemo } from "react";
import { Link, useParams } from "react-router-dom";
import { jobs } from "../api/endpoints";
import type { Artifact } from "../api/types";
import { LineChart, type ChartSeries } from "../components/LineChart";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader, ProgressBar } from "../components/ui";
import { formatBytes, formatDate, formatNumber, JOB_KIND_LABELS, progressPercent, shortId, TERMINAL_STATUSES } from "../format";
import { useAction, useLoad } from "../hooks";
import { useLiveJob, type LiveMode, type SeriesMap } from "../jobs/live";

export interface ChartGroups {
  loss: ChartSeries[];
  throughput: ChartSeries[];
  bytes: ChartSeries[];
  other: ChartSeries[];
}

const LOSS = /loss/i;
const THROUGHPUT = /throughput|per_s(ec)?$|_per_second|samples_s|tokens_s|rate/i;
const BYTES = /bytes/i;

/** Sorts series into the three charts (and the rest) by name. */
export function groupSeries(series: SeriesMap): ChartGroups {
  const groups: ChartGroups = { loss: [], throughput: [], bytes: [], other: [] };
  for (const name of Object.keys(series).sort()) {
    const entry = { label: name, points: series[name] };
    if (LOSS.test(name)) groups.loss.push(entry);
    else if (BYTES.test(name)) groups.bytes.push(entry);
    else if (THROUGHPUT.test(name)) groups.throughput.push(entry);
    else groups.other.push(entry);
  }
  return groups;
}

const MODE_TEXT: Record<LiveMode, string> = {
  connecting: "Connecting…",
  stream: "Live",
  polling: "Live stream unavailable: refreshing every 2 s",
  done: "Finished",
};

function Artifacts({ jobId, finished }: { jobId: string; finished: boolean }) {
  const list = useLoad(() => jobs.artifacts(jobId), [jobId, finished]);
  const items = list.data?.items ?? [];
  const href = (a: Artifact) =>
    a.url ?? (a.dataset_id ? `/api/v1/datasets/${encodeURIComponent(a.dataset_id)}/content` : a.id ? `/api/v1/jobs/${encodeURIComponent(jobId)}/artifacts/${encodeURIComponent(a.id)}` : undefined);
  return (
    <section className="card" aria-labelledby="artifacts-heading">
      <h2 id="artifacts-heading">Artifacts</h2>
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title={finished ? "This job wrote no artifacts." : "No artifacts yet."}>
          {finished ? null : "Checkpoints and reports appear here as the job writes them."}
        </EmptyState>
      ) : (
        <ul className="artifact-list">
          {items.map((a, i) => {
            const link = href(a);
            return (
              <li key={a.id ?? `${a.name}-${i}`}>
                {link ? (
                  <a href={link} download>
                    {a.name}
                  </a>
                ) : (
                  <span>{a.name}</span>
                )}{" "}
                {a.kind ? <Badge status="neutral">{a.kind}</Badge> : null}{" "}
                <span className="muted small">
                  {a.size_bytes !== undefined ? formatBytes(a.size_bytes) : ""}
                  {a.created_at ? ` · ${formatDate(a.created_at)}` : ""}
                </span>
              </li>
            );
          })}
        </ul>
      )}
    </section>
  );
}

export function JobPage() {
  const { id = "" } = useParams();
  const { job, series, error, mode, reload } = useLiveJob(id);
  const action = useAction();
  const groups = useMemo(() => groupSeries(series), [series]);
  const finished = job ? TERMINAL_STATUSES.has(job.status) : false;
  const percent = job ? (job.status === "succeeded" ? 100 : progressPercent(job.progress, job.step, job.total_steps)) : 0;

  async function cancel() {
    await action.run(async () => {
      await jobs.cancel(id);
      return true;
    }, "Cancellation requested.");
    await reload();
  }

  return (
    <>
      <PageHeader
        title={job ? `${JOB_KIND_LABELS[job.kind] ?? job.kind} · ${shortId(job.id)}` : "Job"}
        subtitle={
          job?.workspace_id ? (
            <Link className="small" to={`/jobs?ws=${encodeURIComponent(job.workspace_id)}`}>
              ← Jobs of the workspace
            </Link>
          ) : (
            <Link className="small" to="/jobs">
              ← Jobs
            </Link>
          )
        }
        actions={job && !finished ? <ConfirmButton label="Cancel job" confirmLabel="Yes, cancel the job" onConfirm={cancel} /> : null}
      />
      <ErrorMessage error={error} />
      <ErrorMessage error={action.error} />
      <Notice>{action.message}</Notice>
      {!job && !error ? <Loading /> : null}
      {job ? (
        <>
          <section className="card" aria-label="Status">
            <div className="section-head">
              <div className="status-line">
                <Badge status={job.status} />
                <span className="muted small" aria-live="polite">
                  {MODE_TEXT[mode]}
                </span>
              </div>
              <span className="muted small">
                step {job.step ?? 0}
                {job.total_steps ? ` of ${job.total_steps}` : ""}
              </span>
            </div>
            <ProgressBar percent={percent} label="Job progress" />
            {job.error ? (
              <div className="alert alert-error" role="alert">
                {job.error}
              </div>
            ) : null}
            <dl className="details details-compact">
              <div className="details-pair">
                <dt>Created</dt>
                <dd>{formatDate(job.created_at)}</dd>
              </div>
              <div className="details-pair">
                <dt>Started</dt>
                <dd>{formatDate(job.started_at)}</dd>
              </div>
              <div className="details-pair">
                <dt>Finished</dt>
                <dd>{formatDate(job.finished_at)}</dd>
              </div>
              {job.placement
                ? Object.entries(job.placement).map(([role, cluster]) => (
                    <div key={role} className="details-pair">
                      <dt>{role}</dt>
                      <dd>{cluster}</dd>
                    </div>
                  ))
                : null}
              {job.metrics
                ? Object.entries(job.metrics)
                    .filter(([, v]) => typeof v === "number")
                    .map(([name, v]) => (
                      <div key={name} className="details-pair">
                        <dt>{name}</dt>
                        <dd>{/bytes/i.test(name) ? formatBytes(v as number) : formatNumber(v as number)}</dd>
                      </div>
                    ))
                : null}
            </dl>
          </section>
          <section className="charts" aria-label="Charts">
            <LineChart title="Loss" series={groups.loss} yLabel="loss" />
            <LineChart title="Throughput" series={groups.throughput} yLabel="per second" />
            <LineChart title="Bytes sent per direction" series={groups.bytes} yLabel="bytes" formatValue={(v) => formatBytes(v)} />
            {groups.other.length ? <LineChart title="Other metrics" series={groups.other} /> : null}
          </section>
          <Artifacts jobId={job.id} finished={finished} />
        </>
      ) : null}
    </>
  );
}
