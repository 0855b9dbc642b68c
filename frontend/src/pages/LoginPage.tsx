/** Sign-in form: the API sets an HttpOnly session cookie and a CSRF cookie. */
import { useState, type FormEvent } from "react";
import { useAuth } from "../auth/AuthContext";
import { ErrorMessage } from "../components/ui";
import { useDocumentTitle } from "../hooks";

export function LoginPage() {
  useDocumentTitle("Sign in");
  const { login, sessionEnded } = useAuth();
  const [email, setEmail] = useState("");
  const [password, setPassword] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);

  async function submit(event: FormEvent) {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      await login(email.trim(), password);
    } catch (err) {
      setError(err);
      setPassword("");
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
        <h1>Sign in</h1>
        {sessionEnded && !error ? (
          <div className="alert alert-info" role="status">
            Your session ended. Sign in again to continue.
          </div>
        ) : null}
        <ErrorMessage error={error} />
        <form onSubmit={submit} aria-label="Sign in">
          <div className="field">
            <label htmlFor="login-email">Email</label>
            <input
              id="login-email"
              type="email"
              autoComplete="username"
              required
              value={email}
              onChange={(e) => setEmail(e.target.value)}
            />
          </div>
          <div className="field">
            <label htmlFor="login-password">Password</label>
            <input
              id="login-password"
              type="password"
              autoComplete="current-password"
              required
              value={password}
              onChange={(e) => setPassword(e.target.value)}
            />
          </div>
          <button type="submit" className="btn btn-primary btn-block" disabled={busy}>
            {busy ? "Signing in…" : "Sign in"}
          </button>
        </form>
        <p className="muted small">Accounts are created by an administrator.</p>
      </div>
    </main>
  );
}
