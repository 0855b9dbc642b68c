/** Submit a job: kind, preset, inputs from own and granted datasets, roles placed on clusters. */
import { useEffect, useMemo, useState, type FormEvent } from "react";
import { Link, useNavigate, useSearchParams } from "react-router-dom";
import { access, clusters, datasets, jobs, workspaces } from "../api/endpoints";
import type { Dataset, JobKind, JobKindSpec } from "../api/types";
import { EmptyState, ErrorMessage, Loading, PageHeader } from "../components/ui";
import { formatBytes, isPast } from "../format";
import { useAction, useLoad } from "../hooks";
import { buildConfig, CODEC_SUGGESTIONS, NO_ADVANCED, presetValue, type AdvancedOptions, type Preset } from "../jobs/specs";

export interface UsableDatasets {
  own: Dataset[];
  granted: Dataset[];
}

/** Datasets the user may name as inputs: every one in their workspaces, and those under an active grant. */
export async function loadUsableDatasets(): Promise<UsableDatasets> {
  const [wsPage, outgoing] = await Promise.all([workspaces.list(), access.list("outgoing").catch(() => ({ items: [], total: 0 }))]);
  const ownPages = await Promise.all(wsPage.items.map((w) => datasets.list(w.id)));
  const own = ownPages.flatMap((p) => p.items);
  const ownIds = new Set(own.map((d) => d.id));
  const active = outgoing.items.filter((r) => r.status === "approved" && !isPast(r.expires_at) && !ownIds.has(r.dataset_id));
  const unique = Array.from(new Map(active.map((r) => [r.dataset_id, r])).values());
  const granted = (
    await Promise.all(
      unique.map(async (r) => {
        try {
          return await datasets.get(r.dataset_id);
        } catch {
          // Still usable by id even if its metadata cannot be read.
          return r.dataset_kind
            ? ({ id: r.dataset_id, name: r.dataset_name ?? r.dataset_id, kind: r.dataset_kind, size_bytes: 0, sha256: "", discoverable: true } as Dataset)
            : null;
        }
      }),
    )
  ).filter((d): d is Dataset => d !== null);
  return { own, granted };
}

type NumericOption = Exclude<keyof AdvancedOptions, "discriminatorReadsText" | "forwardCodec" | "backwardCodec" | "device" | "schedule">;

export function NewJobPage() {
  const [params] = useSearchParams();
  const navigate = useNavigate();
  const wsList = useLoad(() => workspaces.list(), []);
  const usable = useLoad(loadUsableDatasets, []);
  const clusterList = useLoad(() => clusters.list(), []);
  const kindList = useLoad(() => jobs.kinds(), []);
  const [ws, setWs] = useState(params.get("ws") ?? "");
  const [chosenKind, setKind] = useState<JobKind | null>(null);
  const [preset, setPreset] = useState<Preset>("tiny");
  const [inputs, setInputs] = useState<Record<string, string>>({});
  const [placement, setPlacement] = useState<Record<string, string>>({});
  const [advanced, setAdvanced] = useState<AdvancedOptions>(NO_ADVANCED);
  const action = useAction();
  const specs: JobKindSpec[] = useMemo(() => kindList.data?.items ?? [], [kindList.data]);
  const kind = chosenKind ?? specs[0]?.kind; // the table's first kind until one is chosen
  const spec = specs.find((s) => s.kind === kind);
  const has = (field: string) => spec?.config_fields.includes(field) ?? false;
  /** A number field of the advanced options, shown when the kind's config has `field`. */
  const numeric = (kindSpec: JobKindSpec, id: string, label: string, key: NumericOption, field: string, min: number, max?: number) =>
    has(field) ? (
      <NumberField
        id={id}
        label={label}
        min={min}
        max={max}
        placeholder={presetValue(kindSpec, preset, field)}
        value={advanced[key]}
        onChange={(v) => setAdvanced({ ...advanced, [key]: v })}
      />
    ) : null;
  /** A codec spec field of the advanced options, shown when the kind's config has `field`. */
  const codec = (kindSpec: JobKindSpec, id: string, label: string, key: "forwardCodec" | "backwardCodec", field: string) =>
    has(field) ? (
      <CodecField id={id} label={label} placeholder={presetValue(kindSpec, preset, field)} value={advanced[key]} onChange={(v) => setAdvanced({ ...advanced, [key]: v })} />
    ) : null;
  const clusterNames = useMemo(() => (clusterList.data?.items ?? []).map((c) => c.name), [clusterList.data]);
  const cudaClusters = (clusterList.data?.items ?? []).filter((c) => (c.worker_devices ?? []).some((g) => g.device.kind === "cuda")).map((c) => c.name);

  useEffect(() => {
    if (!ws && wsList.data?.items.length) setWs(wsList.data.items[0].id);
  }, [ws, wsList.data]);

  // Place the two roles on two different clusters by default: that is the point of Nebula.
  useEffect(() => {
    if (!spec) return;
    setPlacement((prev) => {
      const next: Record<string, string> = {};
      spec.roles.forEach((role, i) => {
        next[role.name] = prev[role.name] && clusterNames.includes(prev[role.name]) ? prev[role.name] : clusterNames[i % Math.max(clusterNames.length, 1)] ?? "";
      });
      return next;
    });
  }, [spec, clusterNames]);

  const missing = spec
    ? [
        ...spec.inputs.filter((i) => !i.optional && !inputs[i.name]).map((i) => i.label),
        ...spec.roles.filter((r) => !placement[r.name]).map((r) => `${r.label} cluster`),
      ]
    : ["a job kind"];
  const placed = spec ? spec.roles.map((r) => placement[r.name]).filter(Boolean) : [];
  const sameCluster = placed.length > 1 && new Set(placed).size === 1;

  async function submit(event: FormEvent) {
    event.preventDefault();
    if (!ws || !spec || missing.length) return;
    const answer = await action.run(() =>
      jobs.submit(ws, {
        kind,
        config: buildConfig(spec, preset, advanced),
        inputs: Object.fromEntries(spec.inputs.filter((i) => inputs[i.name]).map((i) => [i.name, inputs[i.name]])),
        placement: Object.fromEntries(spec.roles.map((r) => [r.name, placement[r.name]])),
      }),
    );
    if (answer?.id) navigate(`/jobs/${answer.id}`);
  }

  const loading =
    (wsList.loading && !wsList.data) || (usable.loading && !usable.data) || (clusterList.loading && !clusterList.data) || (kindList.loading && !kindList.data);
  const own = usable.data?.own ?? [];
  const granted = usable.data?.granted ?? [];
  const chosen = Object.values(inputs)
    .map((id) => [...own, ...granted].find((d) => d.id === id))
    .filter((d): d is Dataset => d !== undefined);
  /** The chosen input whose grant keeps its data (and what derives from it) off `cluster`. */
  const refusedBy = (cluster: string): Dataset | undefined =>
    chosen.find((d) => d.allowed_clusters !== undefined && d.allowed_clusters !== "any" && !d.allowed_clusters.includes(cluster));
  const greyed = clusterNames.filter((name) => refusedBy(name));

  return (
    <>
      <PageHeader title="New job" subtitle="A job is a configuration of Nebula’s own training code; no user code runs on the clusters." />
      <ErrorMessage error={wsList.error} />
      <ErrorMessage error={usable.error} />
      <ErrorMessage error={clusterList.error} />
      <ErrorMessage error={kindList.error} />
      {loading || !spec ? (
        <Loading />
      ) : !wsList.data?.items.length ? (
        <EmptyState title="You need a workspace first.">
          Create one under <Link to="/workspaces">Workspaces</Link> and upload your data.
        </EmptyState>
      ) : (
        <form className="card job-form" onSubmit={submit} aria-label="Submit job">
          <div className="field">
            <label htmlFor="job-ws">Workspace</label>
            <select id="job-ws" value={ws} onChange={(e) => setWs(e.target.value)}>
              {wsList.data.items.map((w) => (
                <option key={w.id} value={w.id}>
                  {w.name}
                </option>
              ))}
            </select>
          </div>

          <fieldset>
            <legend>Kind</legend>
            <div className="choice-grid">
              {specs.map((s) => (
                <label key={s.kind} className={kind === s.kind ? "choice selected" : "choice"}>
                  <input
                    type="radio"
                    name="job-kind"
                    value={s.kind}
                    checked={kind === s.kind}
                    onChange={() => {
                      setKind(s.kind);
                      setInputs({});
                    }}
                  />
                  <span>
                    <strong>{s.label}</strong>
                    <span className="muted small block">{s.description}</span>
                  </span>
                </label>
              ))}
            </div>
          </fieldset>

          <fieldset>
            <legend>Preset</legend>
            <div className="choice-grid">
              {spec.presets.map((p) => (
                <label key={p.name} className={preset === p.name ? "choice selected" : "choice"}>
                  <input type="radio" name="job-preset" value={p.name} checked={preset === p.name} onChange={() => setPreset(p.name as Preset)} />
                  <span>
                    <strong>{p.name}</strong>
                    <span className="muted small block">{p.hint}</span>
                  </span>
                </label>
              ))}
            </div>
          </fieldset>

          <fieldset>
            <legend>Inputs</legend>
            {spec.inputs.map((input) => {
              const ownOfKind = own.filter((d) => d.kind === input.kind);
              const grantedOfKind = granted.filter((d) => d.kind === input.kind);
              const id = `job-input-${input.name}`;
              return (
                <div className="field" key={input.name}>
                  <label htmlFor={id}>
                    {input.label} <span className="muted small">({input.kind}{input.optional ? ", optional" : ""})</span>
                  </label>
                  <select id={id} required={!input.optional} aria-describedby={input.hint ? `${id}-hint` : undefined} value={inputs[input.name] ?? ""} onChange={(e) => setInputs((prev) => ({ ...prev, [input.name]: e.target.value }))}>
                    <option value="">{input.optional ? "None" : `Choose a ${input.kind} dataset…`}</option>
                    {ownOfKind.length ? (
                      <optgroup label="Your datasets">
                        {ownOfKind.map((d) => (
                          <option key={d.id} value={d.id}>
                            {d.name} ({formatBytes(d.size_bytes)})
                          </option>
                        ))}
                      </optgroup>
                    ) : null}
                    {grantedOfKind.length ? (
                      <optgroup label="Granted to you">
                        {grantedOfKind.map((d) => (
                          <option key={d.id} value={d.id}>
                            {d.name}
                          </option>
                        ))}
                      </optgroup>
                    ) : null}
                  </select>
                  {input.hint ? (
                    <p className="hint" id={`${id}-hint`}>
                      {input.hint}
                    </p>
                  ) : null}
                  {!input.optional && !ownOfKind.length && !grantedOfKind.length ? (
                    <p className="hint">
                      No {input.kind} dataset yet: upload one in a <Link to="/workspaces">workspace</Link> or request one in the{" "}
                      <Link to="/catalog">catalog</Link>.
                    </p>
                  ) : null}
                </div>
              );
            })}
          </fieldset>

          <fieldset>
            <legend>Placement</legend>
            {clusterNames.length === 0 ? (
              <p className="hint">No cluster is registered yet; an administrator must add clusters before jobs can run.</p>
            ) : null}
            {spec.roles.map((role) => {
              const id = `job-role-${role.name}`;
              return (
                <div className="field" key={role.name}>
                  <label htmlFor={id}>{role.label} runs on</label>
                  <select
                    id={id}
                    required
                    aria-describedby={`${id}-hint`}
                    value={placement[role.name] ?? ""}
                    onChange={(e) => setPlacement((prev) => ({ ...prev, [role.name]: e.target.value }))}
                  >
                    <option value="">Choose a cluster…</option>
                    {clusterNames.map((name) => {
                      const refusing = refusedBy(name);
                      return (
                        <option key={name} value={name} disabled={refusing !== undefined}>
                          {refusing ? `${name} (not allowed for ${refusing.name})` : name}
                        </option>
                      );
                    })}
                  </select>
                  <p className="hint" id={`${id}-hint`}>
                    {role.hint}
                  </p>
                </div>
              );
            })}
            {greyed.length ? (
              <p className="hint" data-testid="greyed-clusters">
                Not offered:{" "}
                {greyed
                  .map((name) => {
                    const d = refusedBy(name);
                    return `${name}, which the grant behind “${d?.name ?? "an input"}” does not allow (it allows ${
                      d?.allowed_clusters === "any" ? "any cluster" : (d?.allowed_clusters ?? []).join(", ")
                    })`;
                  })
                  .join("; ")}
                . Every cluster of a job receives something derived from every input.
              </p>
            ) : null}
            {sameCluster ? (
              <p className="hint warn">
                {spec.apart.length ? "These roles must run on different clusters: the server refuses one cluster for both." : "Both roles are on one cluster: nothing crosses a wide-area link."}
              </p>
            ) : null}
          </fieldset>

          <details>
            <summary>Advanced options</summary>
            <p className="muted small">Leave blank to use the preset’s values.</p>
            <div className="form-grid">
              {numeric(spec, "job-steps", "Training steps", "steps", "steps", 1)}
              {numeric(spec, "job-batch", "Batch size", "batchSize", "batch_size", 2)}
              {numeric(spec, "job-ckpt", "Checkpoint every (steps)", "ckptEvery", "ckpt_every", 1)}
              {numeric(spec, "job-seed", "Seed", "seed", "seed", 0)}
              {numeric(spec, "job-ndisc", "Discriminators", "nDiscriminators", "n_discriminators", 1, 16)}
              {has("discriminator_reads_text") ? (
                <div className="field field-check">
                  <input
                    id="job-reads-text"
                    type="checkbox"
                    checked={advanced.discriminatorReadsText}
                    onChange={(e) => setAdvanced({ ...advanced, discriminatorReadsText: e.target.checked })}
                  />
                  <label htmlFor="job-reads-text">The discriminators’ cluster may read the text too (only masked positions cross the link)</label>
                  <p className="hint">
                    Either way that cluster can read the text: turned off, it keeps no copy of the dataset but receives every corrupted sequence and
                    the tokenizer.
                  </p>
                </div>
              ) : null}
              {codec(spec, "job-forward-codec", "Activations codec (encoder → decoder)", "forwardCodec", "forward_codec")}
              {codec(spec, "job-backward-codec", "Gradients codec (decoder → encoder)", "backwardCodec", "backward_codec")}
              {has("forward_codec") ? (
                <p className="hint" id="job-eval-codec-hint">
                  Evaluation (BLEU) sends its activations through the activations codec too, starting warm: power iteration from the training
                  stream’s basis, <code>method=stream</code> from the training stream’s covariance (its first evaluation chunk carries the basis).
                </p>
              ) : null}
              {numeric(spec, "job-compress-from", "Compress from step", "compressFromStep", "compress_from_step", 0)}
              {has("schedule") ? (
                <div className="field">
                  <label htmlFor="job-schedule">Schedule</label>
                  <select id="job-schedule" value={advanced.schedule} onChange={(e) => setAdvanced({ ...advanced, schedule: e.target.value as AdvancedOptions["schedule"] })}>
                    <option value="">Synchronous (sync, the default)</option>
                    <option value="stale1">Overlap the link (stale1)</option>
                  </select>
                  <p className="hint">
                    With stale1 the encoder starts the next step before this step’s last gradient is back, on weights one step stale
                    (PipeDream-2BW): a slow link’s round trip hides behind compute, and the training differs from sync’s.
                  </p>
                </div>
              ) : null}
              {has("device") ? (
                <div className="field">
                  <label htmlFor="job-device">Device</label>
                  <select id="job-device" value={advanced.device} onChange={(e) => setAdvanced({ ...advanced, device: e.target.value as AdvancedOptions["device"] })}>
                    <option value="">Any: what each worker has</option>
                    <option value="cpu">CPU</option>
                    <option value="cuda">CUDA</option>
                  </select>
                  <p className="hint">
                    A worker without the device refuses the role, and the job fails saying so.{" "}
                    {cudaClusters.length ? `CUDA workers are online on ${cudaClusters.join(", ")}.` : "No cluster has a CUDA worker online now."}
                  </p>
                </div>
              ) : null}
            </div>
            {has("forward_codec") || has("backward_codec") ? (
              <datalist id="codec-suggestions">
                {CODEC_SUGGESTIONS.map((c) => (
                  <option key={c} value={c} />
                ))}
              </datalist>
            ) : null}
          </details>

          <ErrorMessage error={action.error} />
          {missing.length ? <p className="hint">Still needed: {missing.join(", ")}.</p> : null}
          <button type="submit" className="btn btn-primary" disabled={action.busy || missing.length > 0}>
            {action.busy ? "Submitting…" : "Submit job"}
          </button>
        </form>
      )}
    </>
  );
}

function NumberField({
  id,
  label,
  value,
  onChange,
  min,
  max,
  placeholder,
}: {
  id: string;
  label: string;
  value: string;
  onChange: (value: string) => void;
  min?: number;
  max?: number;
  placeholder?: string;
}) {
  return (
    <div className="field">
      <label htmlFor={id}>{label}</label>
      <input id={id} type="number" inputMode="numeric" step={1} min={min} max={max} placeholder={placeholder} value={value} onChange={(e) => onChange(e.target.value)} />
    </div>
  );
}

/** A codec spec such as `int8` or `fp16(lowrank(0.2,method=power))`; the server checks the grammar. */
function CodecField({ id, label, value, placeholder, onChange }: { id: string; label: string; value: string; placeholder: string; onChange: (value: string) => void }) {
  return (
    <div className="field">
      <label htmlFor={id}>{label}</label>
      <input
        id={id}
        list="codec-suggestions"
        maxLength={200}
        spellCheck={false}
        autoComplete="off"
        placeholder={placeholder}
        aria-describedby={`${id}-hint`}
        value={value}
        onChange={(e) => onChange(e.target.value)}
      />
      <p className="hint" id={`${id}-hint`}>
        none, fp16, bf16, int8, or a low-rank inside one: fp16(lowrank(0.2)). Default {placeholder}.
      </p>
    </div>
  );
}
