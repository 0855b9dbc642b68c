/** Dataset details: size, sha256, kind, what a job derived it from; the owner may download (once released), list or delete it. */
import { Link, useNavigate, useParams } from "react-router-dom";
import { datasets } from "../api/endpoints";
import type { Dataset } from "../api/types";
import { useUser } from "../auth/AuthContext";
import { Badge, ConfirmButton, ErrorMessage, Loading, Notice, PageHeader, Switch } from "../components/ui";
import { formatBytes, formatDate } from "../format";
import { useAction, useLoad } from "../hooks";
import { DerivedPanel, isUseOnly } from "./Releases";

export function DatasetPage() {
  const { id = "" } = useParams();
  const user = useUser();
  const navigate = useNavigate();
  const dataset = useLoad(() => datasets.get(id), [id]);
  const action = useAction();
  const d = dataset.data;
  const isOwner = d ? (d.owner_id ? d.owner_id === user.id : true) : false;

  async function toggle(discoverable: boolean) {
    if (!d) return;
    const updated = await action.run(async () => ((await datasets.setDiscoverable(d.id, discoverable)) ?? {}) as Partial<Dataset>, discoverable ? "Listed in the catalog." : "Removed from the catalog.");
    if (updated) dataset.setData({ ...d, ...updated, discoverable });
  }

  async function remove() {
    if (!d) return;
    const done = await action.run(async () => {
      await datasets.remove(d.id);
      return true;
    });
    if (done) navigate(d.workspace_id ? `/workspaces/${d.workspace_id}` : "/workspaces");
  }

  return (
    <>
      <PageHeader
        title={d ? d.name : "Dataset"}
        subtitle={
          d?.workspace_id && isOwner ? (
            <Link to={`/workspaces/${d.workspace_id}`} className="small">
              ← Back to the workspace
            </Link>
          ) : undefined
        }
      />
      <ErrorMessage error={dataset.error} />
      {dataset.loading && !d ? <Loading /> : null}
      {d ? (
        <section className="card">
          <dl className="details">
            <dt>Kind</dt>
            <dd>
              <Badge status="neutral">{d.kind}</Badge>
            </dd>
            <dt>Size</dt>
            <dd>
              {formatBytes(d.size_bytes)} <span className="muted small">({d.size_bytes.toLocaleString()} bytes)</span>
            </dd>
            <dt>SHA-256</dt>
            <dd className="mono break">{d.sha256}</dd>
            <dt>Created</dt>
            <dd>{formatDate(d.created_at)}</dd>
            <dt>Owner</dt>
            <dd>{isOwner ? "You" : d.owner_display_name ?? d.owner_email ?? d.owner_id ?? "—"}</dd>
            <dt>In catalog</dt>
            <dd>
              {isOwner ? (
                <Switch checked={d.discoverable} label="Discoverable in the catalog" disabled={action.busy || (isUseOnly(d) && !d.discoverable)} onChange={toggle} />
              ) : d.discoverable ? (
                "Yes"
              ) : (
                "No"
              )}
            </dd>
          </dl>
          <ErrorMessage error={action.error} />
          <Notice>{action.message}</Notice>
          {isOwner ? (
            <div className="button-row">
              {isUseOnly(d) ? (
                <span className="muted">Use-only until its sources' owners release it: no download.</span>
              ) : (
                <a className="btn" href={datasets.contentUrl(d.id)} download={d.name}>
                  Download
                </a>
              )}
              <ConfirmButton label="Delete dataset" confirmLabel="Yes, delete it" onConfirm={remove} />
            </div>
          ) : (
            <p className="muted">You may use this dataset in your jobs under your grant; downloading it is not allowed.</p>
          )}
        </section>
      ) : null}
      {d ? <DerivedPanel dataset={d} isOwner={isOwner} onRequested={(updated) => dataset.setData(updated)} /> : null}
    </>
  );
}
