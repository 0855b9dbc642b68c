/** One workspace: quota, datasets (upload, discoverable switch, delete) and a way to its jobs. */
import { useState } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { datasets, workspaces } from "../api/endpoints";
import type { Dataset } from "../api/types";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader, ProgressBar, Switch } from "../components/ui";
import { formatBytes, formatDate, shortId } from "../format";
import { useAction, useLoad } from "../hooks";
import { UploadForm } from "./UploadForm";
import { isUseOnly, ReleaseBadge } from "./Releases";
import { storagePercent } from "./WorkspacesPage";

export function DatasetTable({
  items,
  onToggle,
  onDelete,
  busy,
}: {
  items: Dataset[];
  onToggle: (dataset: Dataset, discoverable: boolean) => void;
  onDelete: (dataset: Dataset) => void;
  busy?: boolean;
}) {
  return (
    <div className="table-wrap">
      <table>
        <caption className="sr-only">Datasets</caption>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Kind</th>
            <th scope="col">Size</th>
            <th scope="col">SHA-256</th>
            <th scope="col">In catalog</th>
            <th scope="col">
              <span className="sr-only">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {items.map((d) => (
            <tr key={d.id}>
              <td>
                <Link to={`/datasets/${d.id}`}>{d.name}</Link>
              </td>
              <td>
                <Badge status="neutral">{d.kind}</Badge> <ReleaseBadge dataset={d} />
              </td>
              <td>{formatBytes(d.size_bytes)}</td>
              <td className="mono" title={d.sha256 ?? undefined}>
                {shortId(d.sha256, 12)}…
              </td>
              <td>
                <Switch
                  checked={d.discoverable}
                  label={`Discoverable: ${d.name}`}
                  disabled={busy || (isUseOnly(d) && !d.discoverable)}
                  onChange={(on) => onToggle(d, on)}
                />
              </td>
              <td className="actions">
                <ConfirmButton label={`Delete ${d.name}`} confirmLabel="Yes, delete" disabled={busy} onConfirm={() => onDelete(d)} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function WorkspacePage() {
  const { ws = "" } = useParams();
  const navigate = useNavigate();
  const workspace = useLoad(() => workspaces.get(ws), [ws]);
  const list = useLoad(() => datasets.list(ws), [ws]);
  const action = useAction();
  const [showUpload, setShowUpload] = useState(false);

  async function toggle(d: Dataset, discoverable: boolean) {
    const updated = await action.run(
      async () => ((await datasets.setDiscoverable(d.id, discoverable)) ?? {}) as Partial<Dataset>,
      discoverable ? `“${d.name}” is listed in the catalog.` : `“${d.name}” is no longer listed in the catalog.`,
    );
    if (updated) {
      list.setData((prev) => ({
        total: prev?.total ?? 0,
        items: (prev?.items ?? []).map((x) => (x.id === d.id ? { ...x, ...updated, discoverable } : x)),
      }));
    }
  }

  async function remove(d: Dataset) {
    await action.run(() => datasets.remove(d.id), `Deleted “${d.name}”. Grants on it ended.`);
    await Promise.all([list.reload(), workspace.reload()]);
  }

  async function removeWorkspace() {
    const done = await action.run(async () => {
      await workspaces.remove(ws);
      return true;
    });
    if (done) navigate("/workspaces");
  }

  const w = workspace.data;
  const items = list.data?.items ?? [];
  return (
    <>
      <PageHeader
        title={w ? w.name : "Workspace"}
        subtitle={
          <Link to="/workspaces" className="small">
            ← All workspaces
          </Link>
        }
        actions={
          <>
            <Link className="btn" to={`/jobs?ws=${encodeURIComponent(ws)}`}>
              Jobs
            </Link>
            <Link className="btn btn-primary" to={`/jobs/new?ws=${encodeURIComponent(ws)}`}>
              New job
            </Link>
          </>
        }
      />
      <ErrorMessage error={workspace.error} />
      {w ? (
        <section className="card" aria-label="Quota">
          <h2>Quota</h2>
          <ProgressBar percent={storagePercent(w.storage_bytes_used, w.storage_bytes_limit)} label="Storage used" />
          <p className="muted small">
            {formatBytes(w.storage_bytes_used)} used of {formatBytes(w.storage_bytes_limit)} · up to {w.max_concurrent_jobs} concurrent job
            {w.max_concurrent_jobs === 1 ? "" : "s"}
            {w.created_at ? ` · created ${formatDate(w.created_at)}` : ""}
          </p>
        </section>
      ) : null}
      <section className="card" aria-labelledby="datasets-heading">
        <div className="section-head">
          <h2 id="datasets-heading">Datasets</h2>
          <button type="button" className="btn" aria-expanded={showUpload} onClick={() => setShowUpload((s) => !s)}>
            {showUpload ? "Hide upload" : "Upload dataset"}
          </button>
        </div>
        {showUpload ? (
          <UploadForm
            workspaceId={ws}
            onUploaded={() => {
              void list.reload();
              void workspace.reload();
            }}
          />
        ) : null}
        <ErrorMessage error={action.error} />
        <Notice>{action.message}</Notice>
        <ErrorMessage error={list.error} />
        {list.loading && !list.data ? (
          <Loading />
        ) : items.length === 0 ? (
          <EmptyState title="No datasets in this workspace yet.">
            Upload a text corpus, a parallel corpus or a model with “Upload dataset”, or request access to someone else’s in the{" "}
            <Link to="/catalog">catalog</Link>.
          </EmptyState>
        ) : (
          <DatasetTable items={items} onToggle={toggle} onDelete={remove} busy={action.busy} />
        )}
      </section>
      <section className="card danger-zone" aria-label="Danger zone">
        <h2>Delete workspace</h2>
        <p className="muted">Deletes the workspace with its datasets. This cannot be undone.</p>
        <ConfirmButton label="Delete workspace" confirmLabel="Yes, delete this workspace" onConfirm={removeWorkspace} />
      </section>
    </>
  );
}
