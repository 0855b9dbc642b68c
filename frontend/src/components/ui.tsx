/** Small building blocks shared by every page. */
import { useId, useState, type ReactNode } from "react";
import { errorMessage } from "../api/client";
import { useDocumentTitle } from "../hooks";

export function PageHeader({ title, subtitle, actions }: { title: string; subtitle?: ReactNode; actions?: ReactNode }) {
  useDocumentTitle(title);
  return (
    <header className="page-header">
      <div>
        <h1>{title}</h1>
        {subtitle ? <p className="muted">{subtitle}</p> : null}
      </div>
      {actions ? <div className="page-actions">{actions}</div> : null}
    </header>
  );
}

/** Shows an API error as the API's own message. */
export function ErrorMessage({ error, prefix }: { error: unknown; prefix?: string }) {
  if (!error) return null;
  return (
    <div className="alert alert-error" role="alert">
      {prefix ? <strong>{prefix} </strong> : null}
      {errorMessage(error)}
    </div>
  );
}

export function Notice({ children }: { children: ReactNode }) {
  if (!children) return null;
  return (
    <div className="alert alert-success" role="status">
      {children}
    </div>
  );
}

export function Loading({ label = "Loading…" }: { label?: string }) {
  return (
    <p className="muted loading" role="status" aria-live="polite">
      {label}
    </p>
  );
}

export function EmptyState({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <div className="empty-state">
      <p className="empty-title">{title}</p>
      {children ? <div className="muted">{children}</div> : null}
    </div>
  );
}

export function ProgressBar({ percent, label }: { percent: number; label: string }) {
  const clamped = Math.max(0, Math.min(100, percent));
  const rounded = Math.round(clamped * 10) / 10;
  return (
    <div className="progress-wrap">
      <div
        className="progress"
        role="progressbar"
        aria-label={label}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={rounded}
        aria-valuetext={`${rounded}%`}
      >
        <div className="progress-fill" style={{ width: `${clamped}%` }} />
      </div>
      <span className="progress-text">{rounded}%</span>
    </div>
  );
}

const STATUS_TONES: Record<string, string> = {
  active: "ok",
  approved: "ok",
  succeeded: "ok",
  valid: "ok",
  success: "ok",
  running: "info",
  queued: "neutral",
  pending: "warn",
  suspended: "warn",
  expired: "warn",
  withdrawn: "neutral",
  cancelled: "neutral",
  denied: "bad",
  revoked: "bad",
  failed: "bad",
  failure: "bad",
  deleted: "bad",
  error: "bad",
};

export function Badge({ status, children }: { status: string; children?: ReactNode }) {
  const tone = STATUS_TONES[status.toLowerCase()] ?? "neutral";
  return <span className={`badge badge-${tone}`}>{children ?? status}</span>;
}

/** A destructive button that asks for a second, explicit click. */
export function ConfirmButton({
  label,
  confirmLabel,
  onConfirm,
  disabled,
  className = "btn btn-danger",
}: {
  label: string;
  confirmLabel?: string;
  onConfirm: () => void | Promise<void>;
  disabled?: boolean;
  className?: string;
}) {
  const [asking, setAsking] = useState(false);
  if (!asking) {
    return (
      <button type="button" className={className} onClick={() => setAsking(true)} disabled={disabled}>
        {label}
      </button>
    );
  }
  return (
    <span className="confirm" role="group" aria-label={`Confirm: ${label}`}>
      <button
        type="button"
        className="btn btn-danger"
        autoFocus
        onClick={async () => {
          setAsking(false);
          await onConfirm();
        }}
      >
        {confirmLabel ?? `Yes, ${label.toLowerCase()}`}
      </button>
      <button type="button" className="btn btn-ghost" onClick={() => setAsking(false)}>
        Cancel
      </button>
    </span>
  );
}

/** A secret shown once (API token, enrollment token), with a copy button. */
export function SecretOnce({ label, value, note }: { label: string; value: string; note?: ReactNode }) {
  const id = useId();
  const [copied, setCopied] = useState(false);
  return (
    <div className="secret" role="region" aria-label={`${label}, shown once`}>
      <label htmlFor={id}>{label}</label>
      <div className="secret-row">
        <input id={id} className="mono" readOnly value={value} onFocus={(e) => e.currentTarget.select()} />
        <button
          type="button"
          className="btn"
          onClick={async () => {
            try {
              await navigator.clipboard.writeText(value);
              setCopied(true);
            } catch {
              setCopied(false);
            }
          }}
        >
          {copied ? "Copied" : "Copy"}
        </button>
      </div>
      <p className="muted small">{note ?? "Copy it now: it will not be shown again."}</p>
    </div>
  );
}

export function Pager({
  total,
  limit,
  offset,
  onChange,
  label = "Pages",
}: {
  total: number;
  limit: number;
  offset: number;
  onChange: (offset: number) => void;
  label?: string;
}) {
  if (total <= limit && offset === 0) return null;
  const from = total === 0 ? 0 : offset + 1;
  const to = Math.min(offset + limit, total);
  return (
    <nav className="pager" aria-label={label}>
      <button type="button" className="btn btn-ghost" disabled={offset === 0} onClick={() => onChange(Math.max(0, offset - limit))}>
        Previous
      </button>
      <span className="muted">
        {from}–{to} of {total}
      </span>
      <button type="button" className="btn btn-ghost" disabled={offset + limit >= total} onClick={() => onChange(offset + limit)}>
        Next
      </button>
    </nav>
  );
}

/** A labelled on/off switch (a checkbox with role="switch"). */
export function Switch({
  checked,
  onChange,
  label,
  disabled,
  showLabel = false,
}: {
  checked: boolean;
  onChange: (checked: boolean) => void;
  label: string;
  disabled?: boolean;
  showLabel?: boolean;
}) {
  return (
    <label className="switch">
      <input
        type="checkbox"
        role="switch"
        checked={checked}
        aria-checked={checked}
        aria-label={showLabel ? undefined : label}
        disabled={disabled}
        onChange={(e) => onChange(e.currentTarget.checked)}
      />
      <span className="switch-track" aria-hidden="true" />
      {showLabel ? <span>{label}</span> : <span className="switch-state" aria-hidden="true">{checked ? "On" : "Off"}</span>}
    </label>
  );
}

export function Field({ label, hint, children, htmlFor }: { label: string; hint?: ReactNode; children: ReactNode; htmlFor: string }) {
  return (
    <div className="field">
      <label htmlFor={htmlFor}>{label}</label>
      {children}
      {hint ? <p className="hint">{hint}</p> : null}
    </div>
  );
}
