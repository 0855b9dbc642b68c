/** Jobs of one workspace, refreshed while any is still queued or running. */
import { useEffect, useState } from "react";
import { Link, useSearchParams } from "react-router-dom";
import { jobs, workspaces } from "../api/endpoints";
import { Badge, EmptyState, ErrorMessage, Loading, PageHeader, Pager, ProgressBar } from "../components/ui";
import { formatDate, progressPercent, shortId, TERMINAL_STATUSES } from "../format";
import { useLoad } from "../hooks";
import { useJobKinds } from "../jobs/kinds";

const PAGE_SIZE = 25;
const REFRESH_MS = 5000;

export function JobsPage() {
  const [params, setParams] = useSearchParams();
  const wsList = useLoad(() => workspaces.list(), []);
  const kinds = useJobKinds();
  const allWorkspaces = wsList.data?.items ?? [];
  const ws = params.get("ws") || allWorkspaces[0]?.id || "";
  const [offset, setOffset] = useState(0);
  const list = useLoad(() => (ws ? jobs.list(ws, { limit: PAGE_SIZE, offset }) : Promise.resolve({ items: [], total: 0 })), [ws, offset]);
  const items = list.data?.items ?? [];
  const active = items.some((j) => !TERMINAL_STATUSES.has(j.status));

  useEffect(() => {
    if (!active) return;
    const timer = setInterval(() => void list.reload(), REFRESH_MS);
    return () => clearInterval(timer);
  }, [active, ws, offset]);

  return (
    <>
      <PageHeader
        title="Jobs"
        actions={
          <Link className="btn btn-primary" to={ws ? `/jobs/new?ws=${encodeURIComponent(ws)}` : "/jobs/new"}>
            New job
          </Link>
        }
      />
      <ErrorMessage error={wsList.error} />
      {wsList.loading && !wsList.data ? (
        <Loading />
      ) : allWorkspaces.length === 0 ? (
        <EmptyState title="You have no workspace yet.">
          Create a <Link to="/workspaces">workspace</Link> and upload data before you submit a job.
        </EmptyState>
      ) : (
        <>
          <div className="filters">
            <div className="field">
              <label htmlFor="jobs-ws">Workspace</label>
              <select
                id="jobs-ws"
                value={ws}
                onChange={(e) => {
                  setOffset(0);
                  setParams({ ws: e.target.value });
                }}
              >
                {allWorkspaces.map((w) => (
                  <option key={w.id} value={w.id}>
                    {w.name}
                  </option>
                ))}
              </select>
            </div>
          </div>
          <ErrorMessage error={list.error} />
          {list.loading && !list.data ? (
            <Loading />
          ) : items.length === 0 ? (
            <EmptyState title="No jobs in this workspace yet.">
              Start one with <Link to={`/jobs/new?ws=${encodeURIComponent(ws)}`}>New job</Link>: pick a kind, a preset, your inputs and the clusters.
            </EmptyState>
          ) : (
            <div className="table-wrap">
              <table>
                <caption className="sr-only">Jobs</caption>
                <thead>
                  <tr>
                    <th scope="col">Job</th>
                    <th scope="col">Kind</th>
                    <th scope="col">Status</th>
                    <th scope="col">Progress</th>
                    <th scope="col">Created</th>
                  </tr>
                </thead>
                <tbody>
                  {items.map((j) => (
                    <tr key={j.id}>
                      <td>
                        <Link to={`/jobs/${j.id}`} aria-label={`Job ${shortId(j.id)}`} className="mono">
                          {shortId(j.id)}
                        </Link>
                      </td>
                      <td>{kinds.label(j.kind)}</td>
                      <td>
                        <Badge status={j.status} />
                      </td>
                      <td className="cell-progress">
                        <ProgressBar percent={progressPercent(j.progress, j.step, j.total_steps)} label={`Progress of job ${shortId(j.id)}`} />
                      </td>
                      <td>{formatDate(j.created_at)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <Pager total={list.data?.total ?? 0} limit={PAGE_SIZE} offset={offset} onChange={setOffset} label="Job pages" />
        </>
      )}
    </>
  );
}
