/** The user's own workspaces, with their quotas. */
import { useState, type FormEvent } from "react";
import { Link, useNavigate } from "react-router-dom";
import { workspaces } from "../api/endpoints";
import { EmptyState, ErrorMessage, Loading, PageHeader, ProgressBar } from "../components/ui";
import { formatBytes } from "../format";
import { useAction, useLoad } from "../hooks";

export function storagePercent(used: number, limit: number): number {
  return limit > 0 ? (used / limit) * 100 : 0;
}

export function WorkspacesPage() {
  const list = useLoad(() => workspaces.list(), []);
  const [name, setName] = useState("");
  const action = useAction();
  const navigate = useNavigate();

  async function create(event: FormEvent) {
    event.preventDefault();
    const ws = await action.run(() => workspaces.create(name.trim()));
    if (ws) navigate(`/workspaces/${ws.id}`);
  }

  const items = list.data?.items ?? [];
  return (
    <>
      <PageHeader title="Workspaces" subtitle="Your datasets and jobs live in workspaces. Only you can see them." />
      <section className="card">
        <form className="inline-form" onSubmit={create} aria-label="Create workspace">
          <div className="field">
            <label htmlFor="ws-name">New workspace name</label>
            <input id="ws-name" required maxLength={100} value={name} onChange={(e) => setName(e.target.value)} />
          </div>
          <button type="submit" className="btn btn-primary" disabled={action.busy}>
            Create workspace
          </button>
        </form>
        <ErrorMessage error={action.error} />
      </section>
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="You have no workspace yet.">Create one above, then upload a dataset into it.</EmptyState>
      ) : (
        <ul className="cards" aria-label="Workspaces">
          {items.map((ws) => (
            <li key={ws.id} className="card card-link">
              <h2>
                <Link to={`/workspaces/${ws.id}`}>{ws.name}</Link>
              </h2>
              <ProgressBar percent={storagePercent(ws.storage_bytes_used, ws.storage_bytes_limit)} label={`Storage used in ${ws.name}`} />
              <p className="muted small">
                {formatBytes(ws.storage_bytes_used)} of {formatBytes(ws.storage_bytes_limit)} · up to {ws.max_concurrent_jobs} concurrent job
                {ws.max_concurrent_jobs === 1 ? "" : "s"}
              </p>
            </li>
          ))}
        </ul>
      )}
    </>
  );
}
