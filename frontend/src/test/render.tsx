import { render } from "@testing-library/react";
import type { ReactElement } from "react";
import { MemoryRouter, Route, Routes } from "react-router-dom";
import { App } from "../App";
import { AuthProvider, useAuth } from "../auth/AuthContext";

function SignedIn({ children }: { children: ReactElement }) {
  const { user } = useAuth();
  return user ? children : <p>signed out</p>;
}

/** Renders the whole app at a path (the fake API decides who is signed in). */
export function renderApp(path = "/") {
  return render(
    <MemoryRouter initialEntries={[path]}>
      <App />
    </MemoryRouter>,
  );
}

/** Renders one page at a path, behind the auth provider (GET /me must answer). */
export function renderPage(element: ReactElement, { path = "/", route = "/" }: { path?: string; route?: string } = {}) {
  return render(
    <MemoryRouter initialEntries={[path]}>
      <AuthProvider>
        <Routes>
          <Route path={route} element={<SignedIn>{element}</SignedIn>} />
        </Routes>
      </AuthProvider>
    </MemoryRouter>,
  );
}
