/** Admin: storage and concurrency quotas of every workspace. */
import { useState, type FormEvent } from "react";
import { users, workspaces } from "../../api/endpoints";
import type { Workspace } from "../../api/types";
import { EmptyState, ErrorMessage, Loading, Notice, PageHeader, ProgressBar } from "../../components/ui";
import { formatBytes, shortId } from "../../format";
import { useAction, useLoad } from "../../hooks";

const GIB = 1024 ** 3;

export function gibToBytes(gib: string): number {
  return Math.round(Number(gib) * GIB);
}

function QuotaRow({ ws, ownerLabel, onSaved }: { ws: Workspace; ownerLabel?: string; onSaved: (ws: Workspace) => void }) {
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
        <span className="muted small">{ws.is_personal ? "personal · " : ""}{ownerLabel ?? ws.owner_email ?? `owner ${shortId(ws.owner_id)}`}</span>
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
  const people = useLoad(() => users.list({ limit: 500 }), []);
  const [owner, setOwner] = useState("");
  const ownerId = owner || people.data?.items[0]?.id || "";
  const list = useLoad(() => (ownerId ? workspaces.listOwnedBy(ownerId) : Promise.resolve({ items: [], total: 0 })), [ownerId]);
  const items = list.data?.items ?? [];
  const ownerUser = people.data?.items.find((u) => u.id === ownerId);
  return (
    <>
      <PageHeader title="Quotas" subtitle="Storage limit and concurrent jobs per workspace. Uploads over the limit are refused." />
      <ErrorMessage error={people.error} />
      {people.loading && !people.data ? (
        <Loading />
      ) : (
        <div className="filters">
          <div className="field">
            <label htmlFor="quota-owner">Owner</label>
            <select id="quota-owner" value={ownerId} onChange={(e) => setOwner(e.target.value)}>
              {(people.data?.items ?? []).map((u) => (
                <option key={u.id} value={u.id}>
                  {u.display_name} ({u.email})
                </option>
              ))}
            </select>
          </div>
        </div>
      )}
      <ErrorMessage error={list.error} />
      {ownerId && list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title={ownerUser ? `${ownerUser.display_name} has no workspace.` : "No user yet."}>
          {ownerUser ? "Every user gets a personal workspace when created; pick another owner." : "Create users under Users first."}
        </EmptyState>
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
                <QuotaRow
                  key={ws.id}
                  ws={ws}
                  ownerLabel={ownerUser?.email}
                  onSaved={(u) => list.setData((prev) => ({ total: prev?.total ?? 0, items: (prev?.items ?? []).map((x) => (x.id === u.id ? u : x)) }))}
                />
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
