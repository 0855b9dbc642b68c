/** Sign-in form: the API sets an HttpOnly session cookie and a CSRF cookie. Accounts with a
 * second factor are asked for a code; "Forgot password?" mails a reset link. */
import { useEffect, useState, type FormEvent } from "react";
import { ApiError } from "../api/client";
import { auth } from "../api/endpoints";
import { useAuth } from "../auth/AuthContext";
import type { OidcInfo } from "../api/types";
import { ErrorMessage } from "../components/ui";
import { useDocumentTitle } from "../hooks";

/** Where the browser starts single sign-on: the API sends it on to the identity provider. */
export const SSO_START = "/api/v1/auth/oidc/login";

/** The API's answer when the password was right and a second-factor code is missing. */
export const CODE_REQUIRED = "a second-factor code is required";

function ForgotPasswordForm({ onBack }: { onBack: () => void }) {
  const [email, setEmail] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [sent, setSent] = useState<string | null>(null);

  async function submit(event: FormEvent) {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const answer = await auth.forgotPassword(email.trim());
      setSent(answer.detail);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  }

  return (
    <>
      <h1>Reset your password</h1>
      {sent ? (
        <div className="alert alert-info" role="status">
          {sent.charAt(0).toUpperCase() + sent.slice(1)}. The link works once, for 30 minutes.
        </div>
      ) : (
        <form onSubmit={submit} aria-label="Reset password">
          <ErrorMessage error={error} />
          <div className="field">
            <label htmlFor="forgot-email">Email</label>
            <input id="forgot-email" type="email" autoComplete="username" required value={email} onChange={(e) => setEmail(e.target.value)} />
          </div>
          <button type="submit" className="btn btn-primary btn-block" disabled={busy}>
            {busy ? "Sending…" : "Send reset link"}
          </button>
        </form>
      )}
      <p className="small">
        <button type="button" className="btn btn-ghost" onClick={onBack}>
          Back to sign in
        </button>
      </p>
    </>
  );
}

export function LoginPage() {
  useDocumentTitle("Sign in");
  const { login, sessionEnded } = useAuth();
  const [email, setEmail] = useState("");
  const [password, setPassword] = useState("");
  const [code, setCode] = useState("");
  const [needsCode, setNeedsCode] = useState(false);
  const [forgot, setForgot] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [sso, setSso] = useState<OidcInfo | null>(null);

  useEffect(() => {
    let live = true;
    auth
      .oidcInfo()
      .then((info) => live && setSso(info))
      .catch(() => live && setSso(null));
    return () => {
      live = false;
    };
  }, []);
  const passwordLogin = sso?.password_login ?? true;

  async function submit(event: FormEvent) {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      await login(email.trim(), password, needsCode ? code.trim() : undefined);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401 && err.detail === CODE_REQUIRED) {
        setNeedsCode(true);
      } else {
        setError(err);
        setCode("");
        if (!needsCode) setPassword("");
      }
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
        {forgot ? (
          <ForgotPasswordForm onBack={() => setForgot(false)} />
        ) : (
          <>
            <h1>Sign in</h1>
            {sessionEnded && !error ? (
              <div className="alert alert-info" role="status">
                Your session ended. Sign in again to continue.
              </div>
            ) : null}
            <ErrorMessage error={error} />
            {sso?.enabled ? (
              <a className="btn btn-primary btn-block" href={SSO_START}>
                Sign in with {sso.provider_name}
              </a>
            ) : null}
            {passwordLogin ? (
              <>
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
                  {needsCode ? (
                    <div className="field">
                      <label htmlFor="login-code">Code from your authenticator app</label>
                      <input
                        id="login-code"
                        autoComplete="one-time-code"
                        inputMode="text"
                        required
                        autoFocus
                        maxLength={32}
                        aria-describedby="login-code-hint"
                        value={code}
                        onChange={(e) => setCode(e.target.value)}
                      />
                      <p className="hint" id="login-code-hint">
                        Six digits, or one of your recovery codes.
                      </p>
                    </div>
                  ) : null}
                  <button type="submit" className="btn btn-primary btn-block" disabled={busy}>
                    {busy ? "Signing in…" : "Sign in"}
                  </button>
                </form>
                <p className="small">
                  <button type="button" className="btn btn-ghost" onClick={() => setForgot(true)}>
                    Forgot password?
                  </button>
                </p>
              </>
            ) : null}
            <p className="muted small">Accounts are created by an administrator.</p>
          </>
        )}
      </div>
    </main>
  );
}
