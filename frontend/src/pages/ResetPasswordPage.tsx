/** Choose a new password with a one-time reset link. The link's secret is in the URL's
 * fragment (never sent to a server in a request line or a Referer), read once and cleared. */
import { useState, type FormEvent } from "react";
import { auth } from "../api/endpoints";
import { ErrorMessage } from "../components/ui";
import { useDocumentTitle } from "../hooks";

const MIN_PASSWORD_LENGTH = 12;

function tokenFromFragment(): string {
  const params = new URLSearchParams(window.location.hash.replace(/^#/, ""));
  return params.get("token") ?? "";
}

export function ResetPasswordPage() {
  useDocumentTitle("Choose a new password");
  const [token] = useState(() => {
    const found = tokenFromFragment();
    // out of the address bar and the history entry: a shared screen or a back button keeps no copy
    if (found) window.history.replaceState(null, "", window.location.pathname);
    return found;
  });
  const [password, setPassword] = useState("");
  const [confirm, setConfirm] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [localError, setLocalError] = useState<string | null>(null);
  const [done, setDone] = useState(false);

  async function submit(event: FormEvent) {
    event.preventDefault();
    setLocalError(null);
    if (password !== confirm) {
      setLocalError("The new passwords do not match.");
      return;
    }
    setBusy(true);
    setError(null);
    try {
      await auth.resetPassword(token, password);
      setDone(true);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  }

  return (
    <main id="main" className="login-page">
      <div className="login-card card">
        <p className="brand brand-large">
          <span className="brand-mark" aria-hidden="true" />
          Nebula
        </p>
        <h1>Choose a new password</h1>
        {done ? (
          <div className="alert alert-info" role="status">
            Your password is changed, and every session of your account was signed out.{" "}
            <a href="/">Sign in</a> with the new password.
          </div>
        ) : !token ? (
          <div className="alert alert-error" role="alert">
            This page needs the link from your reset email, or from your administrator.
          </div>
        ) : (
          <form onSubmit={submit} aria-label="Choose a new password">
            <ErrorMessage error={error} />
            {localError ? (
              <div className="alert alert-error" role="alert">
                {localError}
              </div>
            ) : null}
            <div className="field">
              <label htmlFor="reset-new">New password</label>
              <input
                id="reset-new"
                type="password"
                autoComplete="new-password"
                required
                minLength={MIN_PASSWORD_LENGTH}
                value={password}
                onChange={(e) => setPassword(e.target.value)}
              />
              <p className="hint">At least {MIN_PASSWORD_LENGTH} characters. The link works once.</p>
            </div>
            <div className="field">
              <label htmlFor="reset-confirm">Repeat new password</label>
              <input id="reset-confirm" type="password" autoComplete="new-password" required value={confirm} onChange={(e) => setConfirm(e.target.value)} />
            </div>
            <button type="submit" className="btn btn-primary btn-block" disabled={busy}>
              {busy ? "Saving…" : "Set new password"}
            </button>
          </form>
        )}
      </div>
    </main>
  );
}
