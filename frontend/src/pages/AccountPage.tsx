/** The signed-in user's own settings: password, second factor, personal API tokens, recent activity. */
import { useState, type FormEvent } from "react";
import { auth } from "../api/endpoints";
import type { NewApiToken, TotpEnrolment } from "../api/types";
import { useUser } from "../auth/AuthContext";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader, SecretOnce } from "../components/ui";
import { formatDate, isPast } from "../format";
import { useAction, useLoad } from "../hooks";

const MIN_PASSWORD_LENGTH = 12;

export function ChangePasswordForm() {
  const [current, setCurrent] = useState("");
  const [next, setNext] = useState("");
  const [confirm, setConfirm] = useState("");
  const [localError, setLocalError] = useState<string | null>(null);
  const action = useAction();

  async function submit(event: FormEvent) {
    event.preventDefault();
    setLocalError(null);
    if (next !== confirm) {
      setLocalError("The new passwords do not match.");
      return;
    }
    const done = await action.run(async () => {
      await auth.changePassword(current, next);
      return true;
    }, "Password changed. Your other sessions were signed out.");
    if (done) {
      setCurrent("");
      setNext("");
      setConfirm("");
    }
  }

  return (
    <section className="card" aria-labelledby="password-heading">
      <h2 id="password-heading">Change password</h2>
      <form onSubmit={submit} aria-label="Change password">
        <div className="field">
          <label htmlFor="pw-current">Current password</label>
          <input id="pw-current" type="password" autoComplete="current-password" required value={current} onChange={(e) => setCurrent(e.target.value)} />
        </div>
        <div className="field">
          <label htmlFor="pw-new">New password</label>
          <input
            id="pw-new"
            type="password"
            autoComplete="new-password"
            required
            minLength={MIN_PASSWORD_LENGTH}
            aria-describedby="pw-new-hint"
            value={next}
            onChange={(e) => setNext(e.target.value)}
          />
          <p className="hint" id="pw-new-hint">
            At least {MIN_PASSWORD_LENGTH} characters. Signing in elsewhere will be needed again.
          </p>
        </div>
        <div className="field">
          <label htmlFor="pw-confirm">Repeat new password</label>
          <input id="pw-confirm" type="password" autoComplete="new-password" required value={confirm} onChange={(e) => setConfirm(e.target.value)} />
        </div>
        {localError ? (
          <div className="alert alert-error" role="alert">
            {localError}
          </div>
        ) : null}
        <ErrorMessage error={action.error} />
        <Notice>{action.message}</Notice>
        <button type="submit" className="btn btn-primary" disabled={action.busy}>
          Change password
        </button>
      </form>
    </section>
  );
}

/** The QR code the server drew for the otpauth URI, shown as an image (never as markup). */
function QrCode({ svg }: { svg: string }) {
  return <img className="qr-code" width={200} height={200} alt="QR code for your authenticator app" src={`data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`} />;
}

export function SecondFactor() {
  const status = useLoad(() => auth.totpStatus(), []);
  const [enrolment, setEnrolment] = useState<TotpEnrolment | null>(null);
  const [code, setCode] = useState("");
  const [recoveryCodes, setRecoveryCodes] = useState<string[] | null>(null);
  const action = useAction();

  async function begin() {
    const begun = await action.run(() => auth.totpEnrol());
    if (begun) {
      setEnrolment(begun);
      setRecoveryCodes(null);
    }
  }

  async function confirm(event: FormEvent) {
    event.preventDefault();
    const answer = await action.run(() => auth.totpConfirm(code.trim()), "Second factor enrolled. Sign-in now asks for a code.");
    setCode("");
    if (answer) {
      setEnrolment(null);
      setRecoveryCodes(answer.recovery_codes);
      await status.reload();
    }
  }

  async function remove(event: FormEvent) {
    event.preventDefault();
    const done = await action.run(async () => {
      await auth.totpRemove(code.trim());
      return true;
    }, "Second factor removed.");
    setCode("");
    if (done) await status.reload();
  }

  const state = status.data;
  return (
    <section className="card" aria-labelledby="totp-heading">
      <h2 id="totp-heading">Second factor</h2>
      <ErrorMessage error={status.error} />
      {state?.required && !state.enrolled ? (
        <div className="alert alert-info" role="status">
          This platform requires administrators to use a second factor. Enrol one to continue: until then, nothing else is available.
        </div>
      ) : null}
      <ErrorMessage error={action.error} />
      <Notice>{action.message}</Notice>
      {recoveryCodes ? (
        <SecretOnce
          label="Recovery codes (each works once, in place of a code)"
          value={recoveryCodes.join(" ")}
          note="Keep them somewhere safe, apart from your phone: they will not be shown again."
        />
      ) : null}
      {!state ? (
        <Loading />
      ) : state.enrolled ? (
        <>
          <p>
            An authenticator app protects your account. <Badge status="active" /> {state.recovery_codes_left} recovery codes left.
          </p>
          {state.required ? null : (
            <form className="inline-form" onSubmit={remove} aria-label="Remove second factor">
              <div className="field">
                <label htmlFor="totp-remove-code">Code</label>
                <input id="totp-remove-code" autoComplete="one-time-code" required maxLength={32} value={code} onChange={(e) => setCode(e.target.value)} />
              </div>
              <button type="submit" className="btn btn-danger" disabled={action.busy}>
                Remove second factor
              </button>
            </form>
          )}
        </>
      ) : enrolment ? (
        <>
          <p>Scan this code with an authenticator app (or type the secret into it), then enter the six digits it shows.</p>
          <QrCode svg={enrolment.qr_svg} />
          <p className="muted small">
            Secret: <code className="mono">{enrolment.secret}</code>
          </p>
          <form className="inline-form" onSubmit={confirm} aria-label="Confirm second factor">
            <div className="field">
              <label htmlFor="totp-confirm-code">Code from the app</label>
              <input id="totp-confirm-code" autoComplete="one-time-code" inputMode="numeric" required maxLength={6} value={code} onChange={(e) => setCode(e.target.value)} />
            </div>
            <button type="submit" className="btn btn-primary" disabled={action.busy}>
              Confirm
            </button>
          </form>
        </>
      ) : (
        <>
          <p className="muted">Sign-in will ask for a code from an app on your phone as well as your password.</p>
          <button type="button" className="btn btn-primary" onClick={() => void begin()} disabled={action.busy}>
            Set up an authenticator app
          </button>
        </>
      )}
    </section>
  );
}

export function ApiTokens() {
  const tokens = useLoad(() => auth.listTokens(), []);
  const factor = useLoad(() => auth.totpStatus(), []);
  const [name, setName] = useState("");
  const [days, setDays] = useState(30);
  const [otp, setOtp] = useState("");
  const [created, setCreated] = useState<NewApiToken | null>(null);
  const action = useAction();
  const needsCode = factor.data?.enrolled ?? false;

  async function create(event: FormEvent) {
    event.preventDefault();
    const token = await action.run(() => auth.createToken(name.trim(), days, needsCode ? otp.trim() : undefined));
    setOtp("");
    if (token) {
      setCreated(token);
      setName("");
      await tokens.reload();
    }
  }

  async function revoke(id: string, tokenName: string) {
    await action.run(() => auth.revokeToken(id), `Token “${tokenName}” revoked.`);
    if (created?.id === id) setCreated(null);
    await tokens.reload();
  }

  const items = tokens.data?.items ?? [];
  return (
    <section className="card" aria-labelledby="tokens-heading">
      <h2 id="tokens-heading">Personal API tokens</h2>
      <p className="muted">
        For scripts and the command line: send <code>Authorization: Bearer &lt;token&gt;</code>. A token acts as you, so keep it secret.
      </p>
      <form className="inline-form" onSubmit={create} aria-label="Create API token">
        <div className="field">
          <label htmlFor="token-name">Token name</label>
          <input id="token-name" required maxLength={100} value={name} onChange={(e) => setName(e.target.value)} placeholder="e.g. laptop CLI" />
        </div>
        <div className="field field-narrow">
          <label htmlFor="token-days">Expires in (days)</label>
          <input id="token-days" type="number" min={1} max={365} required value={days} onChange={(e) => setDays(Number(e.target.value))} />
        </div>
        {needsCode ? (
          <div className="field field-narrow">
            <label htmlFor="token-otp">Code from your app</label>
            <input id="token-otp" autoComplete="one-time-code" required maxLength={32} value={otp} onChange={(e) => setOtp(e.target.value)} />
          </div>
        ) : null}
        <button type="submit" className="btn btn-primary" disabled={action.busy}>
          Create token
        </button>
      </form>
      {created ? <SecretOnce label={`New token “${created.name}”`} value={created.token} /> : null}
      <ErrorMessage error={action.error} />
      <Notice>{action.message}</Notice>
      <ErrorMessage error={tokens.error} />
      {tokens.loading && !tokens.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="No API tokens yet.">Create one above when a script needs to call the API as you.</EmptyState>
      ) : (
        <div className="table-wrap">
          <table>
            <caption className="sr-only">Your API tokens</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Created</th>
                <th scope="col">Expires</th>
                <th scope="col">State</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {items.map((t) => {
                const state = t.revoked_at ? "revoked" : isPast(t.expires_at) ? "expired" : "active";
                return (
                  <tr key={t.id}>
                    <td>{t.name}</td>
                    <td>{formatDate(t.created_at)}</td>
                    <td>{formatDate(t.expires_at)}</td>
                    <td>
                      <Badge status={state} />
                    </td>
                    <td className="actions">
                      {state === "active" ? (
                        <ConfirmButton label={`Revoke ${t.name}`} confirmLabel="Yes, revoke" onConfirm={() => revoke(t.id, t.name)} />
                      ) : null}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

function MyActivity() {
  const events = useLoad(() => auth.myAudit({ limit: 20 }), []);
  const items = events.data?.items ?? [];
  return (
    <section className="card" aria-labelledby="activity-heading">
      <h2 id="activity-heading">Recent activity on your account</h2>
      <ErrorMessage error={events.error} />
      {events.loading && !events.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="Nothing recorded yet." />
      ) : (
        <ul className="activity">
          {items.map((e) => (
            <li key={e.id}>
              <span className="mono">{e.action}</span> <Badge status={e.outcome} /> <span className="muted small">{formatDate(e.at)}</span>
              {e.ip ? <span className="muted small"> · from {e.ip}</span> : null}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

export function AccountPage() {
  const user = useUser();
  return (
    <>
      <PageHeader title="Account" subtitle={`${user.display_name} · ${user.email} · ${user.role}`} />
      <div className="grid-2">
        <ChangePasswordForm />
        <SecondFactor />
      </div>
      <ApiTokens />
      <MyActivity />
    </>
  );
}
