/** Admin: the queued and running jobs of every tenant, live. Metadata only: who, what, where,
 * how far; the API gives an admin no job's data, config or metrics here. */
import { overview } from "../../api/endpoints";
import { Badge, EmptyState, ErrorMessage, Loading, PageHeader, ProgressBar } from "../../components/ui";
import { formatDate, progressPercent, shortId } from "../../format";
import { useLoad, usePoll } from "../../hooks";
import { useJobKinds } from "../../jobs/kinds";
import { HEALTH_POLL_MS } from "./ClustersPage";

export function RunningJobsPage() {
  const list = useLoad(() => overview.activeJobs(), []);
  const kinds = useJobKinds();
  usePoll(() => void list.reload(), HEALTH_POLL_MS);
  const items = list.data?.items ?? [];
  return (
    <>
      <PageHeader title="Running jobs" subtitle="Every tenant's queued and running jobs, with their clusters. No data and no metrics are shown here." />
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="No job is queued or running." />
      ) : (
        <div className="table-wrap card">
          <table>
            <caption className="sr-only">Active jobs across tenants</caption>
            <thead>
              <tr>
                <th scope="col">Job</th>
                <th scope="col">Owner</th>
                <th scope="col">Kind</th>
                <th scope="col">Status</th>
                <th scope="col">Clusters</th>
                <th scope="col">Progress</th>
                <th scope="col">Started</th>
              </tr>
            </thead>
            <tbody>
              {items.map((j) => (
                <tr key={j.id}>
                  <td className="mono">{shortId(j.id)}</td>
                  <td>{j.owner_email}</td>
                  <td>{kinds.label(j.kind)}</td>
                  <td>
                    <Badge status={j.status}>{j.status}</Badge>
                    {j.attempt > 1 ? <span className="muted small block">attempt {j.attempt}</span> : null}
                  </td>
                  <td className="small">
                    {Object.entries(j.placement)
                      .map(([role, cluster]) => `${role} on ${cluster}`)
                      .join(", ")}
                  </td>
                  <td className="cell-progress">
                    <ProgressBar percent={progressPercent(j.progress, j.step, j.total_steps)} label={`Progress of job ${shortId(j.id)}`} />
                  </td>
                  <td>
                    {j.started_at ? formatDate(j.started_at) : "not yet"}
                    {j.waiting ? <span className="muted small block">{j.waiting.reason}</span> : null}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
