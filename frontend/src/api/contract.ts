/**
 * The UI's API shapes (./types.ts) checked against the types generated from the server's
 * OpenAPI document (./schema.d.ts, `make api-types`): if the server renames, drops or retypes a
 * field the UI reads, or the UI sends a body the server would refuse, `tsc` fails here.
 */
import type { components } from "./schema";
import type {
  AccessRequest,
  Artifact,
  AuditEvent,
  AuditVerification,
  Certificate,
  Cluster,
  Dataset,
  EnrollmentToken,
  Job,
  JobMetrics,
  JobOverview,
  JobKindSpec,
  JobSubmission,
  NewApiToken,
  Page,
  Presence,
  ReleaseRequest,
  SignedCertificate,
  User,
  WorkerCredential,
  Workspace,
} from "./types";

type Schemas = components["schemas"];
/** Compiles only when the server's `Answer` can be read as the UI's `Shape`. */
type Fits<Answer extends Shape, Shape> = [Answer, Shape];

export type AnswersTheUiReads = [
  Fits<Schemas["UserOut"], User>,
  Fits<Schemas["UserList"], Page<User>>,
  Fits<Schemas["TokenCreatedOut"], NewApiToken>,
  Fits<Schemas["WorkspaceOut"], Workspace>,
  Fits<Schemas["DatasetOut"], Dataset>,
  Fits<Schemas["DatasetList"], Page<Dataset>>,
  Fits<Schemas["AccessRequestOut"], AccessRequest>,
  Fits<Schemas["ReleaseRequestOut"], ReleaseRequest>,
  Fits<Schemas["ClusterOut"], Cluster>,
  Fits<Schemas["PresenceOut"], Presence>,
  Fits<Schemas["WorkerCredentialOut"], WorkerCredential>,
  Fits<Schemas["CertificateOut"], Certificate>,
  Fits<Schemas["IssuedOut"], SignedCertificate>,
  Fits<Schemas["EnrollmentTokenOut"], EnrollmentToken>,
  Fits<Schemas["JobOut"], Job>,
  Fits<Schemas["JobOverviewOut"], JobOverview>,
  Fits<Schemas["JobKindList"], { items: JobKindSpec[] }>,
  Fits<Schemas["MetricsOut"], JobMetrics>,
  Fits<Schemas["ArtifactOut"], Artifact>,
  Fits<Schemas["AuditEventOut"], AuditEvent>,
  Fits<Schemas["VerificationOut"], AuditVerification>,
];

/** The job form builds its body loosely typed; the kinds and keys it may use are the server's. */
export type BodiesTheUiSends = [
  Fits<JobSubmission["kind"], Schemas["ElectraJobIn"]["kind"] | Schemas["AbnetJobIn"]["kind"]>,
];
