/** Who is signed in. The session lives in an HttpOnly cookie; nothing is kept in storage. */
import { createContext, useCallback, useContext, useEffect, useMemo, useState, type ReactNode } from "react";
import { ApiError, setUnauthorizedHandler } from "../api/client";
import { auth } from "../api/endpoints";
import type { Role, User } from "../api/types";

export type AuthStatus = "loading" | "anonymous" | "signed-in";

export interface AuthValue {
  status: AuthStatus;
  user: User | null;
  /** Set when the session ended on its own (expired, revoked). */
  sessionEnded: boolean;
  login: (email: string, password: string, otp?: string) => Promise<void>;
  logout: () => Promise<void>;
  refresh: () => Promise<void>;
}

const AuthContext = createContext<AuthValue | null>(null);

export function AuthProvider({ children }: { children: ReactNode }) {
  const [user, setUser] = useState<User | null>(null);
  const [status, setStatus] = useState<AuthStatus>("loading");
  const [sessionEnded, setSessionEnded] = useState(false);

  const refresh = useCallback(async () => {
    try {
      const me = await auth.me();
      setUser(me);
      setStatus("signed-in");
    } catch (err) {
      if (!(err instanceof ApiError) || err.status === 401 || err.status === 403) {
        setUser(null);
        setStatus("anonymous");
      } else {
        // The server is unreachable or failing; treat as signed out so the form can show a message.
        setUser(null);
        setStatus("anonymous");
      }
    }
  }, []);

  useEffect(() => {
    setUnauthorizedHandler(() => {
      setUser(null);
      setStatus("anonymous");
      setSessionEnded(true);
    });
    void refresh();
    return () => setUnauthorizedHandler(null);
  }, [refresh]);

  const login = useCallback(async (email: string, password: string, otp?: string) => {
    const answer = await auth.login(email, password, otp);
    let me: User | undefined = answer?.user;
    if (!me) me = await auth.me();
    setUser(me);
    setStatus("signed-in");
    setSessionEnded(false);
  }, []);

  const logout = useCallback(async () => {
    try {
      await auth.logout();
    } finally {
      setUser(null);
      setStatus("anonymous");
      setSessionEnded(false);
    }
  }, []);

  const value = useMemo<AuthValue>(
    () => ({ status, user, sessionEnded, login, logout, refresh }),
    [status, user, sessionEnded, login, logout, refresh],
  );
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}

export function useAuth(): AuthValue {
  const value = useContext(AuthContext);
  if (!value) throw new Error("useAuth outside AuthProvider");
  return value;
}

/** The signed-in user; only for pages rendered behind the sign-in gate. */
export function useUser(): User {
  const { user } = useAuth();
  if (!user) throw new Error("useUser without a signed-in user");
  return user;
}

export const canAdminister = (role: Role | undefined) => role === "admin";
export const canAudit = (role: Role | undefined) => role === "admin" || role === "auditor";
