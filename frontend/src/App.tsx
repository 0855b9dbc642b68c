/** Routes. Pages a role may not use are neither linked nor routed for it. */
import { Navigate, Route, Routes } from "react-router-dom";
import { AuthProvider, canAdminister, canAudit, useAuth } from "./auth/AuthContext";
import { Layout } from "./components/Layout";
import { Loading } from "./components/ui";
import { AccessPage } from "./pages/AccessPage";
import { AccountPage } from "./pages/AccountPage";
import { ClustersPage } from "./pages/admin/ClustersPage";
import { QuotasPage } from "./pages/admin/QuotasPage";
import { RunningJobsPage } from "./pages/admin/RunningJobsPage";
import { UsersPage } from "./pages/admin/UsersPage";
import { AuditPage } from "./pages/AuditPage";
import { CatalogPage } from "./pages/CatalogPage";
import { DatasetPage } from "./pages/DatasetPage";
import { JobPage } from "./pages/JobPage";
import { JobsPage } from "./pages/JobsPage";
import { LoginPage } from "./pages/LoginPage";
import { NewJobPage } from "./pages/NewJobPage";
import { NotFoundPage } from "./pages/NotFoundPage";
import { ResetPasswordPage } from "./pages/ResetPasswordPage";
import { WorkspacePage } from "./pages/WorkspacePage";
import { WorkspacesPage } from "./pages/WorkspacesPage";

export function AppRoutes() {
  const { status, user, logout } = useAuth();

  if (status === "loading") {
    return (
      <main id="main" className="login-page">
        <Loading />
      </main>
    );
  }
  // a reset link opens its page whether or not someone is signed in on this browser
  if (window.location.pathname === "/reset-password") return <ResetPasswordPage />;
  if (!user) return <LoginPage />;

  return (
    <Layout user={user} onSignOut={() => void logout()}>
      <Routes>
        <Route path="/" element={<Navigate to="/workspaces" replace />} />
        <Route path="/login" element={<Navigate to="/workspaces" replace />} />
        <Route path="/workspaces" element={<WorkspacesPage />} />
        <Route path="/workspaces/:ws" element={<WorkspacePage />} />
        <Route path="/datasets/:id" element={<DatasetPage />} />
        <Route path="/catalog" element={<CatalogPage />} />
        <Route path="/access" element={<AccessPage />} />
        <Route path="/jobs" element={<JobsPage />} />
        <Route path="/jobs/new" element={<NewJobPage />} />
        <Route path="/jobs/:id" element={<JobPage />} />
        <Route path="/account" element={<AccountPage />} />
        {canAdminister(user.role) ? (
          <>
            <Route path="/admin" element={<Navigate to="/admin/users" replace />} />
            <Route path="/admin/users" element={<UsersPage />} />
            <Route path="/admin/clusters" element={<ClustersPage />} />
            <Route path="/admin/quotas" element={<QuotasPage />} />
            <Route path="/admin/jobs" element={<RunningJobsPage />} />
          </>
        ) : null}
        {canAudit(user.role) ? <Route path="/audit" element={<AuditPage />} /> : null}
        <Route path="*" element={<NotFoundPage />} />
      </Routes>
    </Layout>
  );
}

export function App() {
  return (
    <AuthProvider>
      <AppRoutes />
    </AuthProvider>
  );
}
