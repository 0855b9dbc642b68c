/** Upload a dataset into a workspace, with a progress bar. */
import { useRef, useState, type FormEvent } from "react";
import type { UploadHandle } from "../api/client";
import { datasets } from "../api/endpoints";
import type { Dataset, DatasetKind } from "../api/types";
import { ErrorMessage, Notice, ProgressBar } from "../components/ui";
import { formatBytes } from "../format";

export const KIND_HINTS: Record<DatasetKind, string> = {
  text: "Plain text corpus (ELECTRA pre-training input).",
  parallel: "Parallel corpus of sentence pairs (ABNet fine-tuning input).",
  model: "A pre-trained model checkpoint (ABNet source or target model).",
};

export function UploadForm({ workspaceId, onUploaded }: { workspaceId: string; onUploaded: (dataset: Dataset) => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [name, setName] = useState("");
  const [kind, setKind] = useState<DatasetKind>("text");
  const [discoverable, setDiscoverable] = useState(false);
  const [progress, setProgress] = useState<{ loaded: number; total: number } | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [message, setMessage] = useState<string | null>(null);
  const handle = useRef<UploadHandle<Dataset> | null>(null);
  const fileInput = useRef<HTMLInputElement>(null);

  async function submit(event: FormEvent) {
    event.preventDefault();
    if (!file) return;
    setError(null);
    setMessage(null);
    setProgress({ loaded: 0, total: file.size });
    const upload = datasets.upload(
      workspaceId,
      { file, name: name.trim() || file.name, kind, discoverable },
      (loaded, total) => setProgress({ loaded, total }),
    );
    handle.current = upload;
    try {
      const dataset = await upload.promise;
      setMessage(`Uploaded “${dataset.name}” (${formatBytes(dataset.size_bytes)}).`);
      setFile(null);
      setName("");
      if (fileInput.current) fileInput.current.value = "";
      onUploaded(dataset);
    } catch (err) {
      setError(err);
    } finally {
      handle.current = null;
      setProgress(null);
    }
  }

  const uploading = progress !== null;
  return (
    <form className="upload-form" onSubmit={submit} aria-label="Upload dataset">
      <div className="form-grid">
        <div className="field">
          <label htmlFor="upload-file">File</label>
          <input
            id="upload-file"
            ref={fileInput}
            type="file"
            aria-required="true"
            disabled={uploading}
            onChange={(e) => {
              const chosen = e.target.files?.[0] ?? null;
              setFile(chosen);
              if (chosen && !name) setName(chosen.name);
            }}
          />
        </div>
        <div className="field">
          <label htmlFor="upload-name">Dataset name</label>
          <input id="upload-name" required maxLength={200} disabled={uploading} value={name} onChange={(e) => setName(e.target.value)} />
        </div>
        <div className="field">
          <label htmlFor="upload-kind">Kind</label>
          <select id="upload-kind" value={kind} disabled={uploading} onChange={(e) => setKind(e.target.value as DatasetKind)} aria-describedby="upload-kind-hint">
            <option value="text">text</option>
            <option value="parallel">parallel</option>
            <option value="model">model</option>
          </select>
          <p className="hint" id="upload-kind-hint">
            {KIND_HINTS[kind]}
          </p>
        </div>
        <div className="field field-check">
          <input id="upload-discoverable" type="checkbox" checked={discoverable} disabled={uploading} onChange={(e) => setDiscoverable(e.target.checked)} />
          <label htmlFor="upload-discoverable">List in the catalog (others can request to use it; never to download it)</label>
        </div>
      </div>
      {progress ? (
        <div className="upload-progress">
          <ProgressBar percent={progress.total ? (progress.loaded / progress.total) * 100 : 0} label="Upload progress" />
          <span className="muted small">
            {formatBytes(progress.loaded)} of {formatBytes(progress.total)}
          </span>
        </div>
      ) : null}
      <ErrorMessage error={error} />
      <Notice>{message}</Notice>
      <div className="button-row">
        <button type="submit" className="btn btn-primary" disabled={uploading || !file}>
          {uploading ? "Uploading…" : "Upload"}
        </button>
        {uploading ? (
          <button type="button" className="btn btn-ghost" onClick={() => handle.current?.abort()}>
            Cancel upload
          </button>
        ) : null}
      </div>
    </form>
  );
}
