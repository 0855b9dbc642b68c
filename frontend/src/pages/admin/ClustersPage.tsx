/** Admin: clusters, their health (switch, workers, jobs: live), enrollment tokens, worker
 * credentials and certificates (expiry, revoke, sign a CSR). */
import { useState, type FormEvent } from "react";
import { clusters } from "../../api/endpoints";
import type { Certificate, Cluster, Device, EnrollmentToken, SignedCertificate, WorkerCredential } from "../../api/types";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader, SecretOnce } from "../../components/ui";
import { daysUntil, formatBytes, formatDate } from "../../format";
import { useAction, useLoad, usePoll } from "../../hooks";

/** How often the page asks for the clusters' health. */
export const HEALTH_POLL_MS = 5000;

const EXPIRY_WARNING_DAYS = 30;

/**
 * A certificate's state for display: revoked, expired, due for renewal, or valid. Switches renew
 * on their own once less than a third of the lifetime is left (workers/switch/tls.py), so only a
 * certificate past that point is flagged; without `not_before`, the last 30 days are.
 */
export function certificateState(cert: Certificate, now: Date = new Date()): { status: string; text: string } {
  if (cert.revoked_at || cert.status === "revoked") return { status: "revoked", text: "revoked" };
  const days = daysUntil(cert.not_after, now);
  if (days === null) return { status: "neutral", text: cert.status ?? "unknown" };
  if (days < 0) return { status: "expired", text: "expired" };
  const start = cert.not_before ? new Date(cert.not_before).getTime() : NaN;
  const end = new Date(cert.not_after).getTime();
  const dueSoon = Number.isFinite(start) && end > start ? end - now.getTime() < (end - start) / 3 : days < EXPIRY_WARNING_DAYS;
  if (dueSoon) return { status: "pending", text: `expires in ${days} day${days === 1 ? "" : "s"}` };
  return { status: "valid", text: `valid, ${days} day${days === 1 ? "" : "s"} left` };
}

function RevokeCertificate({ cert, onRevoked }: { cert: Certificate; onRevoked: (cert: Certificate) => void }) {
  const [reason, setReason] = useState("");
  const [open, setOpen] = useState(false);
  const action = useAction();
  const id = `revoke-reason-${cert.serial}`;

  if (!open) {
    return (
      <button type="button" className="btn btn-danger" onClick={() => setOpen(true)} aria-label={`Revoke certificate ${cert.serial}`}>
        Revoke
      </button>
    );
  }
  return (
    <form
      className="inline-form"
      aria-label={`Revoke certificate ${cert.serial}`}
      onSubmit={async (e: FormEvent) => {
        e.preventDefault();
        const result = await action.run(async () => (await clusters.revokeCertificate(cert.serial, reason.trim())) ?? {});
        if (result) onRevoked({ ...cert, revoked_at: new Date().toISOString(), revocation_reason: reason.trim(), ...result });
      }}
    >
      <div className="field">
        <label htmlFor={id}>Reason</label>
        <input id={id} required value={reason} onChange={(e) => setReason(e.target.value)} placeholder="e.g. key compromise" />
      </div>
      <button type="submit" className="btn btn-danger" disabled={action.busy}>
        Confirm revoke
      </button>
      <button type="button" className="btn btn-ghost" onClick={() => setOpen(false)}>
        Cancel
      </button>
      <ErrorMessage error={action.error} />
    </form>
  );
}

function Certificates({ cluster }: { cluster: Cluster }) {
  const list = useLoad(() => clusters.certificates(cluster.id), [cluster.id]);
  const [csr, setCsr] = useState("");
  const [signed, setSigned] = useState<SignedCertificate | null>(null);
  const action = useAction();
  const items = list.data?.items ?? [];
  const csrId = `csr-${cluster.id}`;

  async function sign(event: FormEvent) {
    event.preventDefault();
    const cert = await action.run(() => clusters.signCsr(cluster.id, csr.trim()), "Certificate issued.");
    if (cert) {
      setSigned(cert);
      setCsr("");
      await list.reload();
    }
  }

  return (
    <div className="certs">
      <h3>Certificates</h3>
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="No certificate issued yet.">Create an enrollment token for the switch, or paste its CSR below.</EmptyState>
      ) : (
        <div className="table-wrap">
          <table>
            <caption className="sr-only">Certificates of {cluster.name}</caption>
            <thead>
              <tr>
                <th scope="col">Serial</th>
                <th scope="col">Valid until</th>
                <th scope="col">State</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {items.map((cert) => {
                const state = certificateState(cert);
                return (
                  <tr key={cert.serial}>
                    <td className="mono break">{cert.serial}</td>
                    <td>{formatDate(cert.not_after)}</td>
                    <td>
                      <Badge status={state.status}>{state.text}</Badge>
                      {cert.revocation_reason ? <span className="muted small block">{cert.revocation_reason}</span> : null}
                    </td>
                    <td className="actions">
                      {state.status !== "revoked" ? (
                        <RevokeCertificate cert={cert} onRevoked={(c) => list.setData((prev) => ({ total: prev?.total ?? 0, items: (prev?.items ?? []).map((x) => (x.serial === c.serial ? c : x)) }))} />
                      ) : null}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
      <details>
        <summary>Sign a CSR from the switch</summary>
        <form onSubmit={sign} aria-label={`Sign CSR for ${cluster.name}`}>
          <div className="field">
            <label htmlFor={csrId}>CSR (PEM)</label>
            <textarea
              id={csrId}
              className="mono"
              rows={6}
              required
              placeholder="-----BEGIN CERTIFICATE REQUEST-----"
              value={csr}
              onChange={(e) => setCsr(e.target.value)}
            />
            <p className="hint">The switch keeps its private key; only the request travels.</p>
          </div>
          <ErrorMessage error={action.error} />
          <Notice>{action.message}</Notice>
          <button type="submit" className="btn" disabled={action.busy}>
            Sign
          </button>
        </form>
        {signed ? (
          <div className="field">
            <label htmlFor={`signed-${cluster.id}`}>Certificate {signed.serial} (valid until {formatDate(signed.not_after)})</label>
            <textarea id={`signed-${cluster.id}`} className="mono" rows={6} readOnly value={signed.certificate_pem} />
          </div>
        ) : null}
      </details>
    </div>
  );
}

/** A worker's device in a few words: "8 × NVIDIA H200, 139.8 GiB each, CUDA 12.8" or "CPU, 16 cores (AMD EPYC)". */
export function describeDevice(device: Device): string {
  const count = device.count ?? 1;
  if (device.kind === "cuda") {
    const parts = [`${count} × ${device.name || "CUDA device"}`];
    if (device.memory_bytes) parts.push(`${formatBytes(device.memory_bytes)}${count > 1 ? " each" : ""}`);
    if (device.runtime) parts.push(`CUDA ${device.runtime}`);
    return parts.join(", ");
  }
  return `CPU, ${count} core${count === 1 ? "" : "s"}${device.name ? ` (${device.name})` : ""}`;
}

/** The online workers' devices: where a job that asks for CUDA can run. */
export function WorkerDevicesLine({ cluster }: { cluster: Cluster }) {
  const groups = cluster.worker_devices ?? [];
  if (!groups.length) return null;
  return (
    <span className="small" data-testid={`devices-${cluster.name}`}>
      {groups.map((g, i) => (
        <span key={i} className="block">
          <Badge status={g.device.kind === "cuda" ? "active" : "neutral"}>{g.device.kind === "cuda" ? "CUDA" : "CPU only"}</Badge>{" "}
          {g.workers} worker{g.workers === 1 ? "" : "s"}: {describeDevice(g.device)}
        </span>
      ))}
    </span>
  );
}

/** The cluster's health in one line: its switch, its workers, what runs there. */
export function ClusterHealth({ cluster }: { cluster: Cluster }) {
  if (cluster.switch_online === undefined) return null;
  const workers = cluster.workers_online ?? 0;
  const jobs = cluster.running_jobs ?? 0;
  return (
    <p className="button-row" aria-label={`Health of ${cluster.name}`}>
      <Badge status={cluster.switch_online ? "active" : "failed"}>{cluster.switch_online ? "switch online" : "switch offline"}</Badge>
      <Badge status={workers > 0 ? "active" : "failed"}>
        {workers} worker{workers === 1 ? "" : "s"} online
      </Badge>
      <Badge status={jobs > 0 ? "running" : "queued"}>
        {jobs} running job{jobs === 1 ? "" : "s"}
      </Badge>
      <ClusterQueue cluster={cluster} />
      <WorkerDevicesLine cluster={cluster} />
      {cluster.broker_user === "missing" ? (
        <>
          <Badge status="failed">no broker user</Badge>
          <span className="muted">{cluster.broker_problem}</span>
        </>
      ) : null}
    </p>
  );
}

/** The cluster's role slots: how many are held, by which tenant, and how many jobs wait. */
export function ClusterQueue({ cluster }: { cluster: Cluster }) {
  if (cluster.slots_in_use === undefined) return null;
  const total = cluster.role_slots ?? null;
  const tenants = cluster.slots_by_tenant ?? [];
  const queued = cluster.queued_jobs ?? 0;
  return (
    <span className="small" data-testid={`queue-${cluster.name}`}>
      {" "}
      {cluster.slots_in_use} of {total ?? "unbounded"} role slots in use
      {tenants.length ? ` (${tenants.map((t) => `${t.tenant}: ${t.slots}`).join(", ")})` : ""}
      {` · ${queued} job${queued === 1 ? "" : "s"} queued`}
    </span>
  );
}

function Processes({ cluster }: { cluster: Cluster }) {
  const list = useLoad(() => clusters.presence(cluster.id), [cluster.id, cluster.workers_online, cluster.switch_online, cluster.running_jobs]);
  const items = list.data?.items ?? [];
  return (
    <details>
      <summary>Processes</summary>
      <ErrorMessage error={list.error} />
      {items.length === 0 ? (
        <p className="muted small">Nothing of this cluster reported in lately.</p>
      ) : (
        <div className="table-wrap">
          <table>
            <caption className="sr-only">Processes of {cluster.name}</caption>
            <thead>
              <tr>
                <th scope="col">Kind</th>
                <th scope="col">Instance</th>
                <th scope="col">Version</th>
                <th scope="col">Device</th>
                <th scope="col">Last seen</th>
                <th scope="col">Running roles</th>
              </tr>
            </thead>
            <tbody>
              {items.map((p) => (
                <tr key={`${p.kind}-${p.instance}`}>
                  <td>{p.kind}</td>
                  <td className="mono break">{p.instance}</td>
                  <td className="mono">{p.version}</td>
                  <td className="small">{p.device ? describeDevice(p.device) : "none"}</td>
                  <td>{formatDate(p.last_seen)}</td>
                  <td className="mono small">{p.running_roles.length ? p.running_roles.join(", ") : "none"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </details>
  );
}

function ClusterCard({ cluster, onDeleted }: { cluster: Cluster; onDeleted: () => void }) {
  const [token, setToken] = useState<EnrollmentToken | null>(null);
  const [credential, setCredential] = useState<WorkerCredential | null>(null);
  const action = useAction();

  return (
    <li className="card" aria-label={`Cluster ${cluster.name}`}>
      <div className="section-head">
        <h2 className="card-title">{cluster.name}</h2>
        {cluster.has_valid_certificate === undefined ? null : cluster.has_valid_certificate ? (
          <Badge status="valid">certificate valid</Badge>
        ) : (
          <Badge status="pending">no valid certificate</Badge>
        )}
      </div>
      <p className="muted small">
        Switch <span className="mono">{cluster.switch_host}:{cluster.switch_port}</span>
        {cluster.created_at ? ` · added ${formatDate(cluster.created_at)}` : ""}
      </p>
      <ClusterHealth cluster={cluster} />
      <div className="button-row">
        <button
          type="button"
          className="btn"
          disabled={action.busy}
          aria-label={`New enrollment token for ${cluster.name}`}
          onClick={async () => {
            const t = await action.run(() => clusters.enrollmentToken(cluster.id));
            if (t) setToken(t);
          }}
        >
          New enrollment token
        </button>
        <button
          type="button"
          className="btn"
          disabled={action.busy}
          aria-label={`New worker credential for ${cluster.name}`}
          onClick={async () => {
            const c = await action.run(() => clusters.workerCredential(cluster.id));
            if (c) setCredential(c);
          }}
        >
          New worker credential
        </button>
        <ConfirmButton
          label={`Delete cluster ${cluster.name}`}
          confirmLabel="Yes, delete the cluster"
          onConfirm={async () => {
            const done = await action.run(async () => {
              await clusters.remove(cluster.id);
              return true;
            });
            if (done) onDeleted();
          }}
        />
      </div>
      <ErrorMessage error={action.error} />
      {token ? (
        <SecretOnce
          label={`Enrollment token for ${cluster.name}`}
          value={token.token}
          note={`Give it to the switch operator. It expires ${formatDate(token.expires_at)} and will not be shown again.`}
        />
      ) : null}
      {credential?.token ? (
        <SecretOnce
          label={`Worker credential for ${cluster.name}`}
          value={credential.token}
          note="For `nebula worker --credential-file` on the cluster's hosts. It will not be shown again."
        />
      ) : null}
      <Processes cluster={cluster} />
      <Certificates cluster={cluster} />
    </li>
  );
}

export function ClustersPage() {
  const list = useLoad(() => clusters.list(), []);
  usePoll(() => void list.reload(), HEALTH_POLL_MS);
  const [name, setName] = useState("");
  const [host, setHost] = useState("");
  const [port, setPort] = useState("7443");
  const action = useAction();
  const items = list.data?.items ?? [];

  async function create(event: FormEvent) {
    event.preventDefault();
    const cluster = await action.run(() => clusters.create({ name: name.trim(), switch_host: host.trim(), switch_port: Number(port) }), `Cluster ${name.trim()} added.`);
    if (cluster) {
      setName("");
      setHost("");
      await list.reload();
    }
  }

  return (
    <>
      <PageHeader title="Clusters and certificates" subtitle="Each cluster talks to the others only through its switch, over mutual TLS with a certificate from the platform CA." />
      <section className="card" aria-labelledby="add-cluster-heading">
        <h2 id="add-cluster-heading">Add cluster</h2>
        <form className="inline-form" onSubmit={create} aria-label="Add cluster">
          <div className="field">
            <label htmlFor="cluster-name">Name</label>
            <input id="cluster-name" required pattern="[a-z0-9][a-z0-9-]*" title="lower-case letters, digits and dashes" value={name} onChange={(e) => setName(e.target.value)} />
          </div>
          <div className="field">
            <label htmlFor="cluster-host">Switch host</label>
            <input id="cluster-host" required value={host} onChange={(e) => setHost(e.target.value)} />
          </div>
          <div className="field field-narrow">
            <label htmlFor="cluster-port">Switch port</label>
            <input id="cluster-port" type="number" min={1} max={65535} required value={port} onChange={(e) => setPort(e.target.value)} />
          </div>
          <button type="submit" className="btn btn-primary" disabled={action.busy}>
            Add cluster
          </button>
        </form>
        <ErrorMessage error={action.error} />
        <Notice>{action.message}</Notice>
        <p className="muted small">
          Switches trust the CA at <a href="/api/v1/pki/ca.pem">/api/v1/pki/ca.pem</a> and check the CRL at <a href="/api/v1/pki/crl.pem">/api/v1/pki/crl.pem</a>.
        </p>
      </section>
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="No cluster yet.">Add one above, then enroll its switch with a token or a CSR.</EmptyState>
      ) : (
        <ul className="stack" aria-label="Clusters">
          {items.map((c) => (
            <ClusterCard key={c.id} cluster={c} onDeleted={() => void list.reload()} />
          ))}
        </ul>
      )}
    </>
  );
}
