/** Admin: create users, change role, suspend, reactivate, delete, issue a password reset link. */
import { useState, type FormEvent } from "react";
import { users } from "../../api/endpoints";
import type { ResetLink, Role, User } from "../../api/types";
import { useUser } from "../../auth/AuthContext";
import { Badge, ConfirmButton, EmptyState, ErrorMessage, Loading, Notice, PageHeader, Pager, SecretOnce } from "../../components/ui";
import { formatDate } from "../../format";
import { useAction, useLoad } from "../../hooks";

const ROLES: Role[] = ["member", "auditor", "admin"];
const PAGE_SIZE = 50;

function CreateUserForm({ onCreated }: { onCreated: (user: User) => void }) {
  const [email, setEmail] = useState("");
  const [displayName, setDisplayName] = useState("");
  const [role, setRole] = useState<Role>("member");
  const [password, setPassword] = useState("");
  const action = useAction();

  async function submit(event: FormEvent) {
    event.preventDefault();
    const user = await action.run(() => users.create({ email: email.trim(), display_name: displayName.trim(), role, password }), `Created ${email.trim()}.`);
    if (user) {
      setEmail("");
      setDisplayName("");
      setPassword("");
      setRole("member");
      onCreated(user);
    }
  }

  return (
    <section className="card" aria-labelledby="create-user-heading">
      <h2 id="create-user-heading">Create user</h2>
      <form onSubmit={submit} aria-label="Create user">
        <div className="form-grid">
          <div className="field">
            <label htmlFor="new-user-email">Email</label>
            <input id="new-user-email" type="email" required autoComplete="off" value={email} onChange={(e) => setEmail(e.target.value)} />
          </div>
          <div className="field">
            <label htmlFor="new-user-name">Display name</label>
            <input id="new-user-name" required value={displayName} onChange={(e) => setDisplayName(e.target.value)} />
          </div>
          <div className="field">
            <label htmlFor="new-user-role">Role</label>
            <select id="new-user-role" value={role} onChange={(e) => setRole(e.target.value as Role)}>
              {ROLES.map((r) => (
                <option key={r} value={r}>
                  {r}
                </option>
              ))}
            </select>
          </div>
          <div className="field">
            <label htmlFor="new-user-password">Initial password</label>
            <input id="new-user-password" type="password" required minLength={12} autoComplete="new-password" value={password} onChange={(e) => setPassword(e.target.value)} />
          </div>
        </div>
        <ErrorMessage error={action.error} />
        <Notice>{action.message}</Notice>
        <button type="submit" className="btn btn-primary" disabled={action.busy}>
          Create user
        </button>
      </form>
    </section>
  );
}

function UserRow({
  user,
  isSelf,
  onChange,
  onResetLink,
}: {
  user: User;
  isSelf: boolean;
  onChange: (user: User | null, message: string) => void;
  onResetLink: (user: User, link: ResetLink) => void;
}) {
  const action = useAction();
  const label = user.email;

  async function resetLink() {
    const link = await action.run(() => users.resetLink(user.id));
    if (link) onResetLink(user, link);
  }

  async function act(kind: "role" | "suspend" | "reactivate" | "delete", role?: Role) {
    const result = await action.run(async () => {
      if (kind === "role") return (await users.update(user.id, { role })) ?? { ...user, role: role! };
      if (kind === "suspend") return (await users.suspend(user.id)) ?? { ...user, status: "suspended" as const };
      if (kind === "reactivate") return (await users.reactivate(user.id)) ?? { ...user, status: "active" as const };
      await users.remove(user.id);
      return { ...user, status: "deleted" as const };
    });
    if (!result) return;
    const messages = {
      role: `${label} is now ${role}.`,
      suspend: `${label} is suspended; their sessions and tokens were revoked.`,
      reactivate: `${label} is active again.`,
      delete: `${label} was deleted.`,
    };
    onChange({ ...user, ...result }, messages[kind]);
  }

  return (
    <tr>
      <td>
        <span className="block">{user.display_name}</span>
        <span className="muted small">{user.email}</span>
      </td>
      <td>
        {isSelf || user.status === "deleted" ? (
          user.role
        ) : (
          <select aria-label={`Role of ${label}`} value={user.role} disabled={action.busy} onChange={(e) => act("role", e.target.value as Role)}>
            {ROLES.map((r) => (
              <option key={r} value={r}>
                {r}
              </option>
            ))}
          </select>
        )}
      </td>
      <td>
        <Badge status={user.status} />
      </td>
      <td>{formatDate(user.created_at)}</td>
      <td className="actions">
        {isSelf ? (
          <span className="muted small">You</span>
        ) : user.status === "deleted" ? null : (
          <>
            {user.status === "active" ? (
              <button type="button" className="btn" disabled={action.busy} onClick={resetLink} aria-label={`Reset link for ${label}`}>
                Reset link
              </button>
            ) : null}
            {user.status === "active" ? (
              <ConfirmButton label={`Suspend ${label}`} confirmLabel="Yes, suspend" className="btn" onConfirm={() => act("suspend")} />
            ) : (
              <button type="button" className="btn" disabled={action.busy} onClick={() => act("reactivate")} aria-label={`Reactivate ${label}`}>
                Reactivate
              </button>
            )}
            <ConfirmButton label={`Delete ${label}`} confirmLabel="Yes, delete" onConfirm={() => act("delete")} />
          </>
        )}
        <ErrorMessage error={action.error} />
      </td>
    </tr>
  );
}

export function UsersPage() {
  const me = useUser();
  const [offset, setOffset] = useState(0);
  const list = useLoad(() => users.list({ limit: PAGE_SIZE, offset }), [offset]);
  const [message, setMessage] = useState<string | null>(null);
  // held in this page's state only: never fetched again, gone once dismissed
  const [resetLink, setResetLink] = useState<{ email: string; link: ResetLink } | null>(null);
  const items = list.data?.items ?? [];

  return (
    <>
      <PageHeader title="Users" subtitle="Every change here is recorded in the audit log." />
      <CreateUserForm
        onCreated={(u) => {
          setMessage(null);
          list.setData((prev) => ({ total: (prev?.total ?? 0) + 1, items: [u, ...(prev?.items ?? [])] }));
        }}
      />
      <Notice>{message}</Notice>
      {resetLink ? (
        <section className="card" aria-label="Password reset link">
          <SecretOnce
            label={`Password reset link for ${resetLink.email}`}
            value={resetLink.link.url}
            note={`Give it to ${resetLink.email} yourself. It works once, expires ${formatDate(resetLink.link.expires_at)} and will not be shown again.`}
          />
          <button type="button" className="btn" onClick={() => setResetLink(null)}>
            Done
          </button>
        </section>
      ) : null}
      <ErrorMessage error={list.error} />
      {list.loading && !list.data ? (
        <Loading />
      ) : items.length === 0 ? (
        <EmptyState title="No users yet.">Create the first one above.</EmptyState>
      ) : (
        <div className="table-wrap">
          <table>
            <caption className="sr-only">Users</caption>
            <thead>
              <tr>
                <th scope="col">User</th>
                <th scope="col">Role</th>
                <th scope="col">Status</th>
                <th scope="col">Created</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {items.map((u) => (
                <UserRow
                  key={u.id}
                  user={u}
                  isSelf={u.id === me.id}
                  onResetLink={(u, link) => {
                    setMessage(null);
                    setResetLink({ email: u.email, link });
                  }}
                  onChange={(updated, text) => {
                    setMessage(text);
                    if (updated) list.setData((prev) => ({ total: prev?.total ?? 0, items: (prev?.items ?? []).map((x) => (x.id === updated.id ? updated : x)) }));
                  }}
                />
              ))}
            </tbody>
          </table>
        </div>
      )}
      <Pager total={list.data?.total ?? 0} limit={PAGE_SIZE} offset={offset} onChange={setOffset} label="User pages" />
    </>
  );
}
