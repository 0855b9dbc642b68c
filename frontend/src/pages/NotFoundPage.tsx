import { Link } from "react-router-dom";
import { EmptyState, PageHeader } from "../components/ui";

export function NotFoundPage() {
  return (
    <>
      <PageHeader title="Page not found" />
      <EmptyState title="There is nothing here, or it is not available to you.">
        Go back to your <Link to="/workspaces">workspaces</Link>.
      </EmptyState>
    </>
  );
}
