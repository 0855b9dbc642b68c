/** Access requests: incoming (approve with expiry, deny, revoke) and outgoing (withdraw); release requests for derived data. */
import { useState, type KeyboardEvent } from "react";
import { Link, useSearchParams } from "react-router-dom";
import { access, clusters as clustersApi } from "../api/endpoints";
import type { AccessRequest, ClusterSet } from "../api/types";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader } from "../components/ui";
import { formatDate, isPast, shortId } from "../format";
import { useAction, useDecisionList, useLoad } from "../hooks";
import { ReleaseRequestList } from "./Releases";

type Direction = "incoming" | "outgoing";
type Tab = Direction | "releases-incoming" | "releases-outgoing";
const TABS: { id: Tab; label: string }[] = [
  { id: "incoming", label: "Requests for my datasets" },
  { id: "outgoing", label: "My requests" },
  { id: "releases-incoming", label: "Releases to decide" },
  { id: "releases-outgoing", label: "My release requests" },
];

/** The status to show: an approved grant past its expiry counts as expired. */
export function effectiveStatus(r: AccessRequest, now: Date = new Date()): string {
  return r.status === "approved" && isPast(r.expires_at, now) ? "expired" : r.status;
}

/** Turns a date input (YYYY-MM-DD) into the end of that day, local time, as ISO 8601. */
export function endOfDayIso(date: string): string | undefined {
  if (!date) return undefined;
  const d = new Date(`${date}T23:59:59`);
  return Number.isNaN(d.getTime()) ? undefined : d.toISOString();
}

/** How a set of clusters reads: "any cluster" or "cluster-a, cluster-b". */
export function clustersLabel(set: ClusterSet | null | undefined): string {
  if (set === null || set === undefined) return "not decided yet";
  return set === "any" ? "any cluster" : set.join(", ");
}

/** Checkboxes choosing clusters; `any` is offered only where `allowAny`. */
export function ClusterChooser({
  id,
  legend,
  names,
  value,
  onChange,
  allowAny,
}: {
  id: string;
  legend: string;
  names: string[];
  value: ClusterSet;
  onChange: (next: ClusterSet) => void;
  allowAny: boolean;
}) {
  const chosen = value === "any" ? [] : value;
  return (
    <fieldset className="cluster-chooser" aria-describedby={`${id}-hint`}>
      <legend>{legend}</legend>
      {allowAny ? (
        <label className="checkbox">
          <input type="checkbox" checked={value === "any"} onChange={(e) => onChange(e.target.checked ? "any" : [])} /> Any cluster
        </label>
      ) : null}
      {names.map((name) => (
        <label key={name} className="checkbox">
          <input
            type="checkbox"
            disabled={value === "any"}
            checked={value === "any" || chosen.includes(name)}
            onChange={(e) => onChange(e.target.checked ? [...chosen, name].sort() : chosen.filter((n) => n !== name))}
          />{" "}
          {name}
        </label>
      ))}
      <p id={`${id}-hint`} className="muted small">
        Every cluster of a job receives something derived from the data; jobs may place roles only on these.
      </p>
    </fieldset>
  );
}

function datasetLabel(r: AccessRequest): string {
  return r.dataset_name ?? `dataset ${shortId(r.dataset_id)}`;
}

function IncomingActions({
  request,
  clusterNames,
  onChange,
}: {
  request: AccessRequest;
  clusterNames: string[];
  onChange: (r: AccessRequest, message: string) => void;
}) {
  const [expiry, setExpiry] = useState("");
  const [chosen, setChosen] = useState<ClusterSet>(request.dataset_default_clusters ?? "any");
  const granted = request.clusters ?? "any";
  // until the owner picks, the pick is everything the grant allows now
  const [narrowPick, setNarrowTo] = useState<string[] | null>(null);
  const narrowTo = narrowPick ?? (granted === "any" ? clusterNames : granted);
  const action = useAction();
  const status = effectiveStatus(request);
  const label = datasetLabel(request);
  const who = request.requester_display_name ?? request.requester_email ?? shortId(request.requester_id);
  const inputId = `expiry-${request.id}`;
  const today = new Date().toISOString().slice(0, 10);

  async function narrow() {
    const result = await action.run(async () => ((await access.narrow(request.id, narrowTo)) ?? {}) as Partial<AccessRequest>);
    if (result !== undefined) onChange({ ...request, clusters: narrowTo, ...result }, `Narrowed: ${who} → ${label} may now go to ${narrowTo.join(", ")}.`);
  }

  async function decide(kind: "approve" | "deny" | "revoke") {
    // A successful call always yields an object here, so undefined means it failed.
    const result = await action.run(async () => {
      const answer =
        kind === "approve"
          ? await access.approve(request.id, endOfDayIso(expiry), chosen)
          : kind === "deny"
            ? await access.deny(request.id)
            : await access.revoke(request.id);
      return (answer ?? {}) as Partial<AccessRequest>;
    });
    const fallbackStatus = kind === "approve" ? "approved" : kind === "deny" ? "denied" : "revoked";
    if (result !== undefined) {
      const updated: AccessRequest = { ...request, status: fallbackStatus, ...result };
      if (kind === "approve" && !result.expires_at) updated.expires_at = endOfDayIso(expiry) ?? null;
      onChange(updated, `${kind === "approve" ? "Approved" : kind === "deny" ? "Denied" : "Revoked"}: ${who} → ${label}.`);
    }
  }

  return (
    <div className="row-actions">
      {status === "pending" ? (
        <>
          <div className="field field-inline">
            <label htmlFor={inputId}>Access expires on (optional)</label>
            <input id={inputId} type="date" min={today} value={expiry} onChange={(e) => setExpiry(e.target.value)} />
          </div>
          <ClusterChooser
            id={`approve-clusters-${request.id}`}
            legend="Clusters the data may go to"
            names={clusterNames}
            value={chosen}
            onChange={setChosen}
            allowAny
          />
          <button
            type="button"
            className="btn btn-primary"
            disabled={action.busy || (chosen !== "any" && chosen.length === 0)}
            title={chosen !== "any" && chosen.length === 0 ? "Choose at least one cluster, or deny" : undefined}
            onClick={() => decide("approve")}
            aria-label={`Approve ${who} for ${label}`}
          >
            Approve
          </button>
          <button type="button" className="btn" disabled={action.busy} onClick={() => decide("deny")} aria-label={`Deny ${who} for ${label}`}>
            Deny
          </button>
        </>
      ) : null}
      {status === "approved" ? (
        <>
          <ClusterChooser
            id={`narrow-clusters-${request.id}`}
            legend="Narrow to"
            names={granted === "any" ? clusterNames : granted}
            value={narrowTo}
            onChange={(next) => setNarrowTo(next === "any" ? clusterNames : next)}
            allowAny={false}
          />
          <button
            type="button"
            className="btn"
            disabled={action.busy || narrowTo.length === 0}
            onClick={() => void narrow()}
            aria-label={`Narrow ${who} for ${label}`}
          >
            Narrow (stops their jobs on removed clusters)
          </button>
          <ConfirmButton label={`Revoke ${who} for ${label}`} confirmLabel="Yes, revoke (stops their running jobs)" onConfirm={() => decide("revoke")} />
        </>
      ) : null}
      <ErrorMessage error={action.error} />
    </div>
  );
}

function OutgoingActions({ request, onChange }: { request: AccessRequest; onChange: (r: AccessRequest, message: string) => void }) {
  const action = useAction();
  const label = datasetLabel(request);
  if (request.status !== "pending") return null;
  return (
    <div className="row-actions">
      <button
        type="button"
        className="btn"
        disabled={action.busy}
        aria-label={`Withdraw request for ${label}`}
        onClick={async () => {
          const result = await action.run(async () => ((await access.withdraw(request.id)) ?? {}) as Partial<AccessRequest>);
          if (result !== undefined) onChange({ ...request, status: "withdrawn", ...result }, `Withdrew your request for ${label}.`);
        }}
      >
        Withdraw
      </button>
      <ErrorMessage error={action.error} />
    </div>
  );
}

export function RequestList({ direction }: { direction: Direction }) {
  const { list, items, message, replace } = useDecisionList(() => access.list(direction), [direction]);
  const clusterList = useLoad(() => clustersApi.list(), []);
  const clusterNames = (clusterList.data?.items ?? []).map((c) => c.name).sort();

  if (list.loading && !list.data) return <Loading />;
  return (
    <>
      <Notice>{message}</Notice>
      <ErrorMessage error={list.error} />
      {items.length === 0 ? (
        direction === "incoming" ? (
          <EmptyState title="No one has asked to use your datasets.">
            Turn on “In catalog” for a dataset in one of your <Link to="/workspaces">workspaces</Link> so others can find it and ask.
          </EmptyState>
        ) : (
          <EmptyState title="You have not requested any dataset.">
            Browse the <Link to="/catalog">catalog</Link> and request access with a purpose.
          </EmptyState>
        )
      ) : (
        <ul className="request-list" aria-label={direction === "incoming" ? "Incoming requests" : "Outgoing requests"}>
          {items.map((r) => {
            const status = effectiveStatus(r);
            return (
              <li key={r.id} className="card request">
                <div className="section-head">
                  <h3 className="card-title">{datasetLabel(r)}</h3>
                  <Badge status={status} />
                </div>
                <p className="muted small">
                  {direction === "incoming"
                    ? `From ${r.requester_display_name ?? r.requester_email ?? shortId(r.requester_id)}`
                    : `Owner ${r.owner_email ?? shortId(r.owner_id)}`}
                  {r.created_at ? ` · asked ${formatDate(r.created_at)}` : ""}
                  {r.expires_at ? ` · ${status === "expired" ? "expired" : "expires"} ${formatDate(r.expires_at)}` : ""}
                </p>
                <p className="small" data-testid="grant-clusters">
                  {r.clusters ? `May go to: ${clustersLabel(r.clusters)}` : `Owner's default: ${clustersLabel(r.dataset_default_clusters ?? "any")}`}
                </p>
                <p className="purpose">
                  <span className="sr-only">Purpose: </span>
                  {r.purpose}
                </p>
                {direction === "incoming" ? <IncomingActions request={r} clusterNames={clusterNames} onChange={replace} /> : <OutgoingActions request={r} onChange={replace} />}
              </li>
            );
          })}
        </ul>
      )}
    </>
  );
}

export function AccessPage() {
  const [params, setParams] = useSearchParams();
  const tab: Tab = TABS.find((t) => t.id === params.get("tab"))?.id ?? "incoming";

  function onKey(event: KeyboardEvent) {
    if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
      const at = TABS.findIndex((t) => t.id === tab);
      const next = TABS[(at + (event.key === "ArrowRight" ? 1 : TABS.length - 1)) % TABS.length].id;
      setParams({ tab: next });
      document.getElementById(`tab-${next}`)?.focus();
    }
  }

  return (
    <>
      <PageHeader
        title="Access requests"
        subtitle="Grants let a requester use a dataset in jobs until they expire or are revoked; what their jobs derive from it leaves only when you release it."
      />
      <div className="tabs" role="tablist" aria-label="Direction" onKeyDown={onKey}>
        {TABS.map((t) => (
          <button
            key={t.id}
            id={`tab-${t.id}`}
            type="button"
            role="tab"
            aria-selected={tab === t.id}
            aria-controls={`panel-${t.id}`}
            tabIndex={tab === t.id ? 0 : -1}
            className={tab === t.id ? "tab active" : "tab"}
            onClick={() => setParams({ tab: t.id })}
          >
            {t.label}
          </button>
        ))}
      </div>
      <div role="tabpanel" id={`panel-${tab}`} aria-labelledby={`tab-${tab}`}>
        {tab === "releases-incoming" ? (
          <ReleaseRequestList key={tab} direction="incoming" />
        ) : tab === "releases-outgoing" ? (
          <ReleaseRequestList key={tab} direction="outgoing" />
        ) : (
          <RequestList key={tab} direction={tab} />
        )}
      </div>
    </>
  );
}
