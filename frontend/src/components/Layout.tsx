/** The app shell: a sidebar on wide screens, a top bar with a menu on phones. */
import { useEffect, useState, type ReactNode } from "react";
import { NavLink, useLocation } from "react-router-dom";
import type { User } from "../api/types";
import { canAdminister, canAudit } from "../auth/AuthContext";

export interface NavItem {
  to: string;
  label: string;
}

/** The pages a role may use; no other page is offered. */
export function navItemsFor(user: Pick<User, "role">): { main: NavItem[]; admin: NavItem[]; audit: NavItem[] } {
  const main: NavItem[] = [
    { to: "/workspaces", label: "Workspaces" },
    { to: "/jobs", label: "Jobs" },
    { to: "/catalog", label: "Catalog" },
    { to: "/access", label: "Access requests" },
    { to: "/account", label: "Account" },
  ];
  const admin: NavItem[] = canAdminister(user.role)
    ? [
        { to: "/admin/users", label: "Users" },
        { to: "/admin/clusters", label: "Clusters" },
        { to: "/admin/jobs", label: "Running jobs" },
        { to: "/admin/quotas", label: "Quotas" },
      ]
    : [];
  const audit: NavItem[] = canAudit(user.role) ? [{ to: "/audit", label: "Audit log" }] : [];
  return { main, admin, audit };
}

function NavList({ items }: { items: NavItem[] }) {
  return (
    <ul>
      {items.map((item) => (
        <li key={item.to}>
          <NavLink to={item.to} className={({ isActive }) => (isActive ? "nav-link active" : "nav-link")}>
            {item.label}
          </NavLink>
        </li>
      ))}
    </ul>
  );
}

export function Layout({ user, onSignOut, children }: { user: User; onSignOut: () => void; children: ReactNode }) {
  const [menuOpen, setMenuOpen] = useState(false);
  const location = useLocation();
  const { main, admin, audit } = navItemsFor(user);

  useEffect(() => setMenuOpen(false), [location.pathname]);

  return (
    <div className="shell">
      <a className="skip-link" href="#main">
        Skip to content
      </a>
      <aside className={menuOpen ? "sidebar open" : "sidebar"}>
        <div className="brand-row">
          <span className="brand">
            <span className="brand-mark" aria-hidden="true" />
            Nebula
          </span>
          <button
            type="button"
            className="btn btn-ghost menu-toggle"
            aria-expanded={menuOpen}
            aria-controls="primary-nav"
            onClick={() => setMenuOpen((open) => !open)}
          >
            {menuOpen ? "Close menu" : "Menu"}
          </button>
        </div>
        <nav id="primary-nav" className="nav" aria-label="Primary">
          <NavList items={main} />
          {admin.length > 0 ? (
            <>
              <h2 className="nav-heading" id="nav-admin">
                Admin
              </h2>
              <NavList items={admin} />
            </>
          ) : null}
          {audit.length > 0 ? (
            <>
              <h2 className="nav-heading">Oversight</h2>
              <NavList items={audit} />
            </>
          ) : null}
          <div className="nav-user">
            <p className="nav-user-name" title={user.email}>
              {user.display_name || user.email}
            </p>
            <p className="muted small">
              {user.email} · <span className="role-tag">{user.role}</span>
            </p>
            <button type="button" className="btn btn-ghost btn-block" onClick={onSignOut}>
              Sign out
            </button>
          </div>
        </nav>
      </aside>
      <main id="main" className="content" tabIndex={-1}>
        {children}
      </main>
    </div>
  );
}
