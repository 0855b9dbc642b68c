/** Audit dashboard (admins and auditors, read-only): filters, chain verification, export. */
import { useState, type FormEvent } from "react";
import { audit, type AuditFilter } from "../api/endpoints";
import type { AuditVerification, NamedAuditEvent } from "../api/types";
import { Badge, EmptyState, ErrorMessage, Loading, PageHeader, Pager } from "../components/ui";
import { formatDate, shortId } from "../format";
import { useLoad } from "../hooks";

const PAGE_SIZE = 50;

/** A datetime-local value (local time) as ISO 8601, or undefined when empty. */
export function localToIso(value: string): string | undefined {
  if (!value) return undefined;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? undefined : d.toISOString();
}

export function ChainBadge({ result, error, loading, onVerify }: { result?: AuditVerification; error: unknown; loading: boolean; onVerify: () => void }) {
  let content;
  if (loading && !result) content = <span className="chain chain-pending">Verifying the chain…</span>;
  else if (error) content = <span className="chain chain-bad">Chain could not be verified</span>;
  else if (result?.ok) content = <span className="chain chain-ok">✓ Chain intact · {result.count.toLocaleString()} events</span>;
  else if (result)
    content = (
      <>
        <span className="chain chain-bad">
          ✗ Chain broken at event #{result.first_bad_seq ?? "?"} · {result.count.toLocaleString()} events checked
        </span>
        {result.problems?.length ? (
          <ul className="chain-problems small">
            {result.problems.map((p) => (
              <li key={`${p.kind}-${p.first_seq}`}>{p.detail}</li>
            ))}
          </ul>
        ) : null}
      </>
    );
  return (
    <div className="chain-row" role="status" aria-live="polite" aria-label="Audit chain verification">
      {content}
      <button type="button" className="btn btn-ghost" onClick={onVerify} disabled={loading}>
        Verify again
      </button>
      <ErrorMessage error={error} />
    </div>
  );
}

/** What the subject's id names now: a person's name and email, a dataset's or job's name. */
export function SubjectName({ event }: { event: NamedAuditEvent }) {
  if (!event.subject_name) return null;
  return (
    <span className="subject-name">
      {event.subject_name}
      {event.subject_email ? <span className="muted small"> {event.subject_email}</span> : null}
    </span>
  );
}

interface FilterForm {
  actor_id: string;
  action: string;
  outcome: string;
  since: string;
  until: string;
}

const EMPTY: FilterForm = { actor_id: "", action: "", outcome: "", since: "", until: "" };

export function toFilter(form: FilterForm): AuditFilter {
  return {
    actor_id: form.actor_id.trim() || undefined,
    action: form.action.trim() || undefined,
    outcome: form.outcome || undefined,
    since: localToIso(form.since),
    until: localToIso(form.until),
  };
}

export function AuditPage() {
  const [form, setForm] = useState<FilterForm>(EMPTY);
  const [filter, setFilter] = useState<AuditFilter>({});
  const [offset, setOffset] = useState(0);
  const verify = useLoad(() => audit.verify(), []);
  const list = useLoad(() => audit.list({ ...filter, limit: PAGE_SIZE, offset }), [JSON.stringify(filter), offset]);
  const items = list.data?.items ?? [];
  const filtered = Object.values(filter).some(Boolean);

  function apply(event: FormEvent) {
    event.preventDefault();
    setOffset(0);
    setFilter(toFilter(form));
  }

  return (
    <>
      <PageHeader
        title="Audit log"
        subtitle="Append-only and hash-chained: every state change and every use of a dataset."
        actions={
          <>
            <a className="btn" href={audit.exportUrl("jsonl")} download aria-label="Export the whole log as JSON lines">
              Export JSONL
            </a>
            <a className="btn" href={audit.exportUrl("csv")} download aria-label="Export the whole log as CSV">
              Export CSV
            </a>
          </>
        }
      />
      <ChainBadge result={verify.data} error={verify.error} loading={verify.loading} onVerify={() => void verify.reload()} />
      <form className="filters card" onSubmit={apply} aria-label="Filter audit events">
        <div className="field">
          <label htmlFor="audit-actor">Actor (user id)</label>
          <input id="audit-actor" value={form.actor_id} onChange={(e) => setForm({ ...form, actor_id: e.target.value })} />
        </div>
        <div className="field">
          <label htmlFor="audit-action">Action</label>
          <input id="audit-action" placeholder="e.g. auth.login" value={form.action} onChange={(e) => setForm({ ...form, action: e.target.value })} />
        </div>
        <div className="field field-narrow">
          <label htmlFor="audit-outcome">Outcome</label>
          <select id="audit-outcome" value={form.outcome} onChange={(e) => setForm({ ...form, outcome: e.target.value })}>
            <option value="">Any</option>
            <option value="success">success</option>
            <option value="denied">denied</option>
            <option value="failure">failure</option>
            <option value="locked">locked</option>
          </select>
        </div>
        <div className="field">
          <label htmlFor="audit-since">From</label>
          <input id="audit-since" type="datetime-local" value={form.since} onChange={(e) => setForm({ ...form, since: e.target.value })} />
        </div>
        <div className="field">
          <label htmlFor="audit-until">Until</label>
          <input id="audit-until" type="datetime-local" value={form.until} onChange={(e) => setForm({ ...form, until: e.target.value })} />
        </div>
        <div className="button-row">
          <button type="submit" className="btn btn-primary">
            Apply filters
          </button>
          <button
            type="button"
            className="btn btn-ghost"
            onClick={() => {
              setForm(EMPTY);
              setFilter({});
              setOffset(0);
            }}
          >
            Clear
          </button>
        </div>
      </form>
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title={filtered ? "No event matches these filters." : "No events recorded yet."}>{filtered ? "Widen the time range or clear the filters." : null}</EmptyState>
      ) : (
        <div className="table-wrap">
          <table className="audit-table">
            <caption className="sr-only">Audit events</caption>
            <thead>
              <tr>
                <th scope="col">#</th>
                <th scope="col">Time</th>
                <th scope="col">Actor</th>
                <th scope="col">Action</th>
                <th scope="col">Subject</th>
                <th scope="col">Outcome</th>
                <th scope="col">Details</th>
              </tr>
            </thead>
            <tbody>
              {items.map((e) => (
                <tr key={e.id}>
                  <td className="mono">{e.seq}</td>
                  <td>{formatDate(e.at)}</td>
                  <td>
                    {e.actor_id ? (
                      <>
                        {e.actor ? (
                          <span className="person">
                            {e.actor.display_name} <span className="muted small">{e.actor.email}</span>
                          </span>
                        ) : null}{" "}
                        <button
                          type="button"
                          className="link-button mono small"
                          title={e.actor_id}
                          aria-label={`Filter by actor ${e.actor ? `${e.actor.email} ` : ""}${e.actor_id}`}
                          onClick={() => {
                            const next = { ...form, actor_id: e.actor_id ?? "" };
                            setForm(next);
                            setOffset(0);
                            setFilter(toFilter(next));
                          }}
                        >
                          {shortId(e.actor_id)}
                        </button>
                      </>
                    ) : (
                      "—"
                    )}
                  </td>
                  <td className="mono">{e.action}</td>
                  <td>
                    {e.subject_type ?? "—"} <SubjectName event={e} />{" "}
                    <span className="mono muted small" title={e.subject_id ?? ""}>
                      {shortId(e.subject_id)}
                    </span>
                  </td>
                  <td>
                    <Badge status={e.outcome} />
                  </td>
                  <td>
                    <details>
                      <summary>Show</summary>
                      <dl className="details details-compact small">
                        <div className="details-pair">
                          <dt>IP</dt>
                          <dd>{e.ip ?? "—"}</dd>
                        </div>
                        <div className="details-pair">
                          <dt>Hash</dt>
                          <dd className="mono break">{e.hash}</dd>
                        </div>
                        <div className="details-pair">
                          <dt>Previous</dt>
                          <dd className="mono break">{e.prev_hash ?? "—"}</dd>
                        </div>
                      </dl>
                      <pre className="json">{JSON.stringify(e.details ?? {}, null, 2)}</pre>
                    </details>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <Pager total={list.data?.total ?? 0} limit={PAGE_SIZE} offset={offset} onChange={setOffset} label="Audit pages" />
    </>
  );
}
