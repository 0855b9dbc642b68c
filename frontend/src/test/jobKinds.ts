/** GET /job-kinds as the server answers it: job-kinds.json is written from the server's table
 * and checked against it (tests/app/jobs/test_jobs_api.py), so component tests hold no copy. */
import type { JobKindSpec } from "../api/types";
import table from "./job-kinds.json";

export const JOB_KINDS = table as { items: JobKindSpec[] };

export function kindSpec(kind: string): JobKindSpec {
  const spec = JOB_KINDS.items.find((k) => k.kind === kind);
  if (!spec) throw new Error(`the server's table has no kind ${kind}`);
  return spec;
}
