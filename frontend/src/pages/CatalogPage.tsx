/** Datasets other owners made discoverable; request to use them in jobs. */
import { useMemo, useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { access, datasets } from "../api/endpoints";
import type { AccessRequest, Dataset } from "../api/types";
import { useUser } from "../auth/AuthContext";
import { Badge, EmptyState, ErrorMessage, Loading, Notice, PageHeader } from "../components/ui";
import { formatBytes, isPast, shortId } from "../format";
import { useAction, useLoad } from "../hooks";

/** The request that best describes where the user stands with a dataset (an open one wins). */
export function latestRequestFor(datasetId: string, requests: AccessRequest[]): AccessRequest | undefined {
  const mine = requests.filter((r) => r.dataset_id === datasetId);
  return mine.find((r) => r.status === "pending") ?? mine.find((r) => r.status === "approved" && !isPast(r.expires_at)) ?? mine[0];
}

function RequestForm({ dataset, onDone }: { dataset: Dataset; onDone: (request: AccessRequest) => void }) {
  const [purpose, setPurpose] = useState("");
  const action = useAction();
  const id = `purpose-${dataset.id}`;

  async function submit(event: FormEvent) {
    event.preventDefault();
    const request = await action.run(() => access.create(dataset.id, purpose.trim()));
    if (request) onDone(request);
  }

  return (
    <form className="request-form" onSubmit={submit} aria-label={`Request access to ${dataset.name}`}>
      <label htmlFor={id}>Purpose</label>
      <textarea
        id={id}
        required
        minLength={3}
        maxLength={2000}
        rows={2}
        placeholder="What will you train with it, and why?"
        value={purpose}
        onChange={(e) => setPurpose(e.target.value)}
      />
      <ErrorMessage error={action.error} />
      <button type="submit" className="btn btn-primary" disabled={action.busy}>
        Send request
      </button>
    </form>
  );
}

export function CatalogPage() {
  const user = useUser();
  const catalog = useLoad(() => datasets.catalog(), []);
  const outgoing = useLoad(() => access.list("outgoing"), []);
  const [search, setSearch] = useState("");
  const [kind, setKind] = useState("");
  const [open, setOpen] = useState<string | null>(null);
  const [message, setMessage] = useState<string | null>(null);

  const items = useMemo(() => {
    const needle = search.trim().toLowerCase();
    return (catalog.data?.items ?? []).filter(
      (d) =>
        (!kind || d.kind === kind) &&
        (!needle || d.name.toLowerCase().includes(needle) || (d.description ?? "").toLowerCase().includes(needle)),
    );
  }, [catalog.data, search, kind]);
  const requests = outgoing.data?.items ?? [];

  function statusCell(d: Dataset) {
    if (d.owner_id && d.owner_id === user.id) return <span className="muted">Yours</span>;
    const request = latestRequestFor(d.id, requests);
    if (!request) return <span className="muted">No access</span>;
    const status = request.status === "approved" && isPast(request.expires_at) ? "expired" : request.status;
    return <Badge status={status} />;
  }

  function canRequest(d: Dataset): boolean {
    if (d.owner_id && d.owner_id === user.id) return false;
    const request = latestRequestFor(d.id, requests);
    return !request || !["pending", "approved"].includes(request.status) || (request.status === "approved" && isPast(request.expires_at));
  }

  return (
    <>
      <PageHeader
        title="Catalog"
        subtitle="Datasets their owners chose to list. An approved request lets you use one in your jobs; it never lets you download it."
      />
      <div className="filters" role="search">
        <div className="field">
          <label htmlFor="catalog-search">Search</label>
          <input id="catalog-search" type="search" value={search} onChange={(e) => setSearch(e.target.value)} placeholder="Dataset name" />
        </div>
        <div className="field field-narrow">
          <label htmlFor="catalog-kind">Kind</label>
          <select id="catalog-kind" value={kind} onChange={(e) => setKind(e.target.value)}>
            <option value="">Any</option>
            <option value="text">text</option>
            <option value="parallel">parallel</option>
            <option value="model">model</option>
          </select>
        </div>
      </div>
      <Notice>{message}</Notice>
      <ErrorMessage error={catalog.error} />
      <ErrorMessage error={outgoing.error} />
      {catalog.loading && !catalog.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title={catalog.data?.items.length ? "No dataset matches the filter." : "The catalog is empty."}>
          {catalog.data?.items.length
            ? "Clear the search or choose another kind."
            : "No owner has listed a dataset yet. You can list your own from its workspace with the “In catalog” switch."}
        </EmptyState>
      ) : (
        <ul className="cards" aria-label="Catalog datasets">
          {items.map((d) => (
            <li key={d.id} className="card">
              <div className="section-head">
                <h2 className="card-title">{d.name}</h2>
                {statusCell(d)}
              </div>
              <p className="muted small">
                <Badge status="neutral">{d.kind}</Badge> {formatBytes(d.size_bytes)} · owner{" "}
                {d.owner_display_name ?? d.owner_email ?? shortId(d.owner_id)} · sha256 <span className="mono">{shortId(d.sha256, 12)}</span>
              </p>
              {d.description ? <p>{d.description}</p> : null}
              {canRequest(d) ? (
                open === d.id ? (
                  <RequestForm
                    dataset={d}
                    onDone={(request) => {
                      setOpen(null);
                      setMessage(`Request sent for “${d.name}”. The owner will approve or deny it; follow it under Access requests.`);
                      outgoing.setData((prev) => ({ total: (prev?.total ?? 0) + 1, items: [request, ...(prev?.items ?? [])] }));
                    }}
                  />
                ) : (
                  <button type="button" className="btn" onClick={() => setOpen(d.id)} aria-label={`Request access to ${d.name}`}>
                    Request access
                  </button>
                )
              ) : latestRequestFor(d.id, requests)?.status === "pending" ? (
                <p className="muted small">
                  Waiting for the owner. <Link to="/access?tab=outgoing">See your requests</Link>
                </p>
              ) : null}
            </li>
          ))}
        </ul>
      )}
    </>
  );
}
