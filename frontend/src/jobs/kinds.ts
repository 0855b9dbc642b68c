/** The job kinds table from the server (GET /job-kinds), loaded once per page view. */
import { jobs } from "../api/endpoints";
import type { JobKindSpec } from "../api/types";
import { useLoad, type Loaded } from "../hooks";

export interface JobKinds {
  specs: JobKindSpec[];
  /** The table's entry of a kind; undefined until loaded (or for a kind it lacks). */
  of: (kind: string) => JobKindSpec | undefined;
  /** The kind's label, or its name until the table is there. */
  label: (kind: string) => string;
  loaded: Loaded<{ items: JobKindSpec[] }>;
}

export function useJobKinds(): JobKinds {
  const loaded = useLoad(() => jobs.kinds(), []);
  const specs = loaded.data?.items ?? [];
  const of = (kind: string) => specs.find((s) => s.kind === kind);
  return { specs, of, label: (kind) => of(kind)?.label ?? kind, loaded };
}
