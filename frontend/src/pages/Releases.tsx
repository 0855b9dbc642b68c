/** Derived data: what a job output derives from, its release state, and release requests. */
import { useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { releases } from "../api/endpoints";
import type { Dataset, ReleaseRequest, ReleaseState } from "../api/types";
import { useUser } from "../auth/AuthContext";
import { Badge, EmptyState, ErrorMessage, Loading, Notice } from "../components/ui";
import { formatBytes, formatDate, shortId } from "../format";
import { useAction, useDecisionList } from "../hooks";

const RELEASE_TEXT: Record<ReleaseState, { label: string; tone: string; explain: string }> = {
  not_needed: { label: "own data", tone: "approved", explain: "Derived from your own data only: it is yours to download and share." },
  required: {
    label: "use-only",
    tone: "expired",
    explain: "Derived from other owners' data: you may use it in jobs while your grants last, but not download or share it until they release it.",
  },
  pending: { label: "release pending", tone: "pending", explain: "You asked for its release; it stays use-only until every source owner approves." },
  released: { label: "released", tone: "approved", explain: "Every source owner released it: it is yours to download, and it stays released." },
};

/** Whether the dataset is derived from others' data and not yet released. */
export function isUseOnly(d: Pick<Dataset, "release">): boolean {
  return d.release === "required" || d.release === "pending";
}

/** The release state of a job output, as a badge; nothing for an upload. */
export function ReleaseBadge({ dataset }: { dataset: Pick<Dataset, "release" | "derived_by_job_id" | "derived_from"> }) {
  const derived = Boolean(dataset.derived_by_job_id) || (dataset.derived_from?.length ?? 0) > 0;
  if (!dataset.release || !derived) return null;
  const text = RELEASE_TEXT[dataset.release];
  return (
    <span title={text.explain}>
      <Badge status={text.tone}>{text.label}</Badge>
    </span>
  );
}

/** The provenance of a job output and, for its owner, the way to ask for its release. */
export function DerivedPanel({ dataset, isOwner, onRequested }: { dataset: Dataset; isOwner: boolean; onRequested: (d: Dataset) => void }) {
  const [purpose, setPurpose] = useState("");
  const action = useAction();
  if (!dataset.derived_by_job_id && !(dataset.derived_from?.length ?? 0)) return null;
  const state = dataset.release ?? "not_needed";

  async function ask(event: FormEvent) {
    event.preventDefault();
    const made = await action.run(() => releases.create(dataset.id, purpose.trim()), "Release requested: the source owners will decide.");
    if (made) {
      setPurpose("");
      onRequested({ ...dataset, release: "pending" });
    }
  }

  return (
    <section className="card" aria-labelledby="derived-heading">
      <div className="section-head">
        <h2 id="derived-heading">Derived data</h2>
        <ReleaseBadge dataset={dataset} />
      </div>
      <p className="muted">{RELEASE_TEXT[state].explain}</p>
      <dl className="details">
        {dataset.derived_by_job_id ? (
          <>
            <dt>Made by job</dt>
            <dd>
              <Link to={`/jobs/${encodeURIComponent(dataset.derived_by_job_id)}`}>{shortId(dataset.derived_by_job_id)}</Link>
            </dd>
          </>
        ) : null}
        <dt>Derived from</dt>
        <dd>
          <ul className="plain-list" aria-label="Derived from">
            {(dataset.derived_from ?? []).map((id) => (
              <li key={id}>
                <Link to={`/datasets/${encodeURIComponent(id)}`}>{dataset.derived_from_names?.[id] ?? shortId(id)}</Link>
              </li>
            ))}
          </ul>
        </dd>
      </dl>
      <Notice>{action.message}</Notice>
      <ErrorMessage error={action.error} />
      {isOwner && state === "required" ? (
        <form className="request-form" onSubmit={ask} aria-label="Ask for release">
          <label htmlFor="release-purpose">Why it should be released</label>
          <textarea id="release-purpose" required maxLength={2000} rows={3} value={purpose} onChange={(e) => setPurpose(e.target.value)} />
          <button type="submit" className="btn btn-primary" disabled={action.busy || !purpose.trim()}>
            Ask for release
          </button>
        </form>
      ) : null}
    </section>
  );
}

function Decision({ request, onChange }: { request: ReleaseRequest; onChange: (r: ReleaseRequest, message: string) => void }) {
  const user = useUser();
  const action = useAction();
  const mine = request.approvals.find((a) => a.owner_id === user.id);
  const label = request.dataset_name ?? `dataset ${shortId(request.dataset_id)}`;
  if (request.status !== "pending" || !mine || mine.status !== "pending") return null;

  async function decide(verb: "approve" | "deny") {
    const answer = await action.run(() => (verb === "approve" ? releases.approve(request.id) : releases.deny(request.id)));
    if (answer) onChange(answer, `${verb === "approve" ? "Approved" : "Denied"} the release of ${label}.`);
  }

  return (
    <div className="row-actions">
      <button type="button" className="btn btn-primary" disabled={action.busy} onClick={() => decide("approve")} aria-label={`Approve the release of ${label}`}>
        Approve release
      </button>
      <button type="button" className="btn" disabled={action.busy} onClick={() => decide("deny")} aria-label={`Deny the release of ${label}`}>
        Deny
      </button>
      <ErrorMessage error={action.error} />
    </div>
  );
}

/** Release requests the user must decide (incoming) or made (outgoing). */
export function ReleaseRequestList({ direction }: { direction: "incoming" | "outgoing" }) {
  const { list, items, message, replace } = useDecisionList(() => releases.list(direction), [direction]);

  if (list.loading && !list.data) return <Loading />;
  return (
    <>
      <Notice>{message}</Notice>
      <ErrorMessage error={list.error} />
      {items.length === 0 ? (
        <EmptyState title={direction === "incoming" ? "No one has asked you to release what they derived from your data." : "You have not asked for any release."}>
          {direction === "incoming" ? null : "A model a job trained on someone else's data shows “Ask for release” on its dataset page."}
        </EmptyState>
      ) : (
        <ul className="request-list" aria-label={direction === "incoming" ? "Incoming release requests" : "Outgoing release requests"}>
          {items.map((r) => (
            <li key={r.id} className="card request">
              <div className="section-head">
                <h3 className="card-title">{r.dataset_name ?? shortId(r.dataset_id)}</h3>
                <Badge status={r.status} />
              </div>
              <p className="muted small">
                {direction === "incoming" ? `From ${r.requester_display_name ?? r.requester_email ?? shortId(r.requester_id)}` : "Your request"}
                {r.dataset_size_bytes !== undefined ? ` · ${r.dataset_kind ?? "dataset"}, ${formatBytes(r.dataset_size_bytes)}` : ""}
                {r.created_at ? ` · asked ${formatDate(r.created_at)}` : ""}
              </p>
              <p className="purpose">
                <span className="sr-only">Purpose: </span>
                {r.purpose}
              </p>
              {r.sources?.length ? (
                <p className="small">
                  Derived from {direction === "incoming" ? "your" : ""} {r.sources.map((s) => s.name).join(", ")}
                </p>
              ) : null}
              <ul className="plain-list small" aria-label="Approvals">
                {r.approvals.map((a) => (
                  <li key={a.owner_id}>
                    {a.owner_display_name}: <Badge status={a.status} />
                  </li>
                ))}
              </ul>
              {direction === "incoming" ? <Decision request={r} onChange={replace} /> : null}
            </li>
          ))}
        </ul>
      )}
    </>
  );
}
