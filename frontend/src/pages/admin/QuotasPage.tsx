/** Admin: storage and concurrency quotas of every workspace. */
import { useState, type FormEvent } from "react";
import { workspaces } from "../../api/endpoints";
import type { Workspace } from "../../api/types";
import { EmptyState, ErrorMessage, Loading, Notice, PageHeader, Pager, ProgressBar } from "../../components/ui";
import { formatBytes, shortId } from "../../format";
import { useAction, useLoad } from "../../hooks";

const GIB = 1024 ** 3;
const PAGE_SIZE = 50;

export function gibToBytes(gib: string): number {
  return Math.round(Number(gib) * GIB);
}

function QuotaRow({ ws, onSaved }: { ws: Workspace; onSaved: (ws: Workspace) => void }) {
  const [gib, setGib] = useState(String(Math.round((ws.storage_bytes_limit / GIB) * 100) / 100));
  const [jobs, setJobs] = useState(String(ws.max_concurrent_jobs));
  const action = useAction();

  async function save(event: FormEvent) {
    event.preventDefault();
    const body = { storage_bytes_limit: gibToBytes(gib), max_concurrent_jobs: Number(jobs) };
    const updated = await action.run(async () => (await workspaces.setQuota(ws.id, body)) ?? { ...ws, ...body }, "Saved.");
    if (updated) onSaved({ ...ws, ...updated });
  }

  return (
    <tr>
      <td>
        <span className="block">{ws.name}</span>
        <span className="muted small">{ws.owner_email ?? `owner ${shortId(ws.owner_id)}`}</span>
      </td>
      <td className="cell-progress">
        <ProgressBar percent={ws.storage_bytes_limit ? (ws.storage_bytes_used / ws.storage_bytes_limit) * 100 : 0} label={`Storage used in ${ws.name}`} />
        <span className="muted small">
          {formatBytes(ws.storage_bytes_used)} of {formatBytes(ws.storage_bytes_limit)}
        </span>
      </td>
      <td>
        <form className="quota-form" onSubmit={save} aria-label={`Quota of ${ws.name}`}>
          <label className="sr-only" htmlFor={`q-storage-${ws.id}`}>
            Storage limit of {ws.name} in GiB
          </label>
          <input id={`q-storage-${ws.id}`} type="number" min={0} step="any" required value={gib} onChange={(e) => setGib(e.target.value)} />
          <span className="muted small">GiB</span>
          <label className="sr-only" htmlFor={`q-jobs-${ws.id}`}>
            Maximum concurrent jobs of {ws.name}
          </label>
          <input id={`q-jobs-${ws.id}`} type="number" min={0} step={1} required value={jobs} onChange={(e) => setJobs(e.target.value)} />
          <span className="muted small">jobs</span>
          <button type="submit" className="btn" disabled={action.busy}>
            Save
          </button>
        </form>
        <ErrorMessage error={action.error} />
        <Notice>{action.message}</Notice>
      </td>
    </tr>
  );
}

export function QuotasPage() {
  const [offset, setOffset] = useState(0);
  const list = useLoad(() => workspaces.listAll({ limit: PAGE_SIZE, offset }), [offset]);
  const items = list.data?.items ?? [];
  return (
    <>
      <PageHeader title="Quotas" subtitle="Storage limit and concurrent jobs per workspace. Uploads over the limit are refused." />
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="No workspace yet.">Workspaces appear here when users are created or make their own.</EmptyState>
      ) : (
        <div className="table-wrap">
          <table>
            <caption className="sr-only">Workspace quotas</caption>
            <thead>
              <tr>
                <th scope="col">Workspace</th>
                <th scope="col">Storage used</th>
                <th scope="col">Limits</th>
              </tr>
            </thead>
            <tbody>
              {items.map((ws) => (
                <QuotaRow key={ws.id} ws={ws} onSaved={(u) => list.setData((prev) => ({ total: prev?.total ?? 0, items: (prev?.items ?? []).map((x) => (x.id === u.id ? u : x)) }))} />
              ))}
            </tbody>
          </table>
        </div>
      )}
      <Pager total={list.data?.total ?? 0} limit={PAGE_SIZE} offset={offset} onChange={setOffset} label="Workspace pages" />
    </>
  );
}
