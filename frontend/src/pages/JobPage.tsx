/** One job, live: progress, charts of loss, throughput and bytes per direction, cancel, artifacts. */
import { useMemo } from "react";
import { Link, useParams } from "react-router-dom";
import { jobs } from "../api/endpoints";
import type { Artifact, Job, JobKindSpec } from "../api/types";
import { LineChart, type ChartSeries } from "../components/LineChart";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader, ProgressBar } from "../components/ui";
import { formatBytes, formatDate, formatNumber, progressPercent, shortId, TERMINAL_STATUSES } from "../format";
import { useAction, useLoad } from "../hooks";
import { useJobKinds } from "../jobs/kinds";
import { useLiveJob, type LiveMode, type SeriesMap } from "../jobs/live";
import { roleDevice, whatEachClusterSees } from "../jobs/specs";

export interface ChartGroups {
  loss: ChartSeries[];
  throughput: ChartSeries[];
  bytes: ChartSeries[];
  other: ChartSeries[];
}

// Series are named `role.metric` (discriminator.rtd_loss, generator.tokens_per_s,
// encoder.bytes_to_decoder, decoder.bleu ...); running totals end in `_total`.
const LOSS = /loss$/i;
const THROUGHPUT = /(per_s|per_sec|per_second|throughput)$/i;
const BYTES_PER_DIRECTION = /bytes_to_[a-z0-9_]+$/i;
const TOTAL = /_total$/i;

/** Sorts series into the three charts (and the rest) by name; running totals are shown as numbers only. */
export function groupSeries(series: SeriesMap): ChartGroups {
  const groups: ChartGroups = { loss: [], throughput: [], bytes: [], other: [] };
  for (const name of Object.keys(series).sort()) {
    if (TOTAL.test(name)) continue;
    const entry = { label: name, points: series[name] };
    if (LOSS.test(name)) groups.loss.push(entry);
    else if (BYTES_PER_DIRECTION.test(name)) groups.bytes.push(entry);
    else if (THROUGHPUT.test(name)) groups.throughput.push(entry);
    else groups.other.push(entry);
  }
  return groups;
}

/** A metric's latest value, in bytes for the per-direction byte counts. */
export function formatMetric(name: string, value: number): string {
  const base = name.replace(TOTAL, "");
  return BYTES_PER_DIRECTION.test(base) ? formatBytes(value) : formatNumber(value);
}

/** The latest value of each metric, by role. */
function MetricValues({ metrics }: { metrics: Job["metrics"] }) {
  const entries = Object.entries(metrics ?? {})
    .filter((entry): entry is [string, number] => typeof entry[1] === "number" && Number.isFinite(entry[1]))
    .sort(([a], [b]) => a.localeCompare(b));
  if (!entries.length) return null;
  return (
    <section className="card" aria-labelledby="metrics-heading">
      <h2 id="metrics-heading">Latest values</h2>
      <div className="table-wrap">
        <table className="metric-table">
          <caption className="sr-only">Latest metric values</caption>
          <thead>
            <tr>
              <th scope="col">Metric</th>
              <th scope="col">Latest</th>
            </tr>
          </thead>
          <tbody>
            {entries.map(([name, value]) => (
              <tr key={name}>
                <td className="mono">{name}</td>
                <td>{formatMetric(name, value)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}

const MODE_TEXT: Record<LiveMode, string> = {
  connecting: "Connecting…",
  stream: "Live",
  polling: "Live stream unavailable: refreshing every 2 s",
  done: "Finished",
};

const ARTIFACT_KIND_LABELS: Record<string, string> = { model: "model", adapters: "adapters", report: "report" };

function Artifacts({ jobId, finished }: { jobId: string; finished: boolean }) {
  const list = useLoad(() => jobs.artifacts(jobId), [jobId, finished]);
  const items = list.data?.items ?? [];
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
        <ul className="artifact-list" aria-label="Artifacts">
          {items.map((a) => (
            <ArtifactItem key={a.id} artifact={a} />
          ))}
        </ul>
      )}
    </section>
  );
}

/** A model or adapters artifact is a dataset in the owner's workspace: it links to that dataset's page. */
function ArtifactItem({ artifact: a }: { artifact: Artifact }) {
  const details = a.details && Object.keys(a.details).length ? a.details : null;
  return (
    <li>
      {a.dataset_id ? <Link to={`/datasets/${encodeURIComponent(a.dataset_id)}`}>{a.name}</Link> : <span>{a.name}</span>}{" "}
      <Badge status="neutral">{ARTIFACT_KIND_LABELS[a.kind] ?? a.kind}</Badge>{" "}
      <span className="muted small">
        {formatBytes(a.size_bytes)}
        {a.created_at ? ` · ${formatDate(a.created_at)}` : ""}
        {a.dataset_id ? " · a dataset in your workspace" : ""}
      </span>
      {details ? (
        <details>
          <summary>{a.kind === "report" ? "Show report" : "Details"}</summary>
          <pre className="json">{JSON.stringify(details, null, 2)}</pre>
        </details>
      ) : null}
    </li>
  );
}

/** What each cluster of the job receives, by role: who could read the data. */
export function ClusterViews({ job, spec }: { job: Pick<Job, "config" | "placement" | "residency">; spec: Pick<JobKindSpec, "roles"> }) {
  const sees = whatEachClusterSees(spec, job.config ?? {});
  const residency = new Map((job.residency ?? []).map((row) => [row.cluster, row]));

  /** Which grants let the data go to the role's cluster: the owner's say, named. */
  function allowedBy(role: string): string | null {
    const row = residency.get(job.placement?.[role] ?? "");
    if (!row) return null;
    if (row.grants.length === 0) return "Allowed: the job's inputs are your own data.";
    const grants = row.grants.map((g) => `grant ${shortId(g.grant_id)} (${g.input}: ${g.clusters === "any" ? "any cluster" : g.clusters.join(", ")})`);
    return `${row.allowed ? "Allowed by" : "Not allowed by"} ${grants.join("; ")}.`;
  }

  return (
    <section className="card" aria-labelledby="sees-heading">
      <h2 id="sees-heading">What each cluster sees</h2>
      <dl className="details">
        {Object.entries(sees).map(([role, text]) => (
          <div key={role} className="details-pair">
            <dt>
              {role}
              {job.placement?.[role] ? ` on ${job.placement[role]}` : ""}
            </dt>
            <dd>
              {text}
              {allowedBy(role) ? (
                <span className="muted small residency" data-testid={`residency-${role}`}>
                  {" "}
                  {allowedBy(role)}
                </span>
              ) : null}
            </dd>
          </div>
        ))}
      </dl>
    </section>
  );
}

export function JobPage() {
  const { id = "" } = useParams();
  const { job, series, error, mode, reload } = useLiveJob(id);
  const kinds = useJobKinds();
  const spec = job ? kinds.of(job.kind) : undefined;
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
        title={job ? `${kinds.label(job.kind)} · ${shortId(job.id)}` : "Job"}
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
            {job.waiting && !finished ? (
              <div className="alert alert-info" data-testid="job-waiting" aria-live="polite">
                In the queue, position {job.waiting.position} for {job.waiting.cluster}. {job.waiting.reason}
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
                      <dd>
                        {cluster}
                        {roleDevice(job.config, role) !== "any" ? ` · needs ${roleDevice(job.config, role).toUpperCase()}` : ""}
                      </dd>
                    </div>
                  ))
                : null}
            </dl>
          </section>
          <section className="charts" aria-label="Charts">
            <LineChart title="Loss" series={groups.loss} yLabel="loss" />
            <LineChart title="Throughput" series={groups.throughput} yLabel="per second" />
            <LineChart title="Bytes sent per direction" series={groups.bytes} yLabel="bytes per step" formatValue={(v) => formatBytes(v)} />
            {groups.other.length ? <LineChart title="Other metrics" series={groups.other} /> : null}
          </section>
          {spec ? <ClusterViews job={job} spec={spec} /> : null}
          <MetricValues metrics={job.metrics} />
          <Artifacts jobId={job.id} finished={finished} />
        </>
      ) : null}
    </>
  );
}
