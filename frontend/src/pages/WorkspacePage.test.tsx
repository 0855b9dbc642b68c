import { screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import { member, mockApi, page, reply } from "../test/mockApi";
import { renderPage } from "../test/render";
import { WorkspacePage } from "./WorkspacePage";
import { WorkspacesPage } from "./WorkspacesPage";

afterEach(() => vi.unstubAllGlobals());

const ws = { id: "w1", name: "lab", owner_id: member.id, storage_bytes_used: 512 * 1024 ** 2, storage_bytes_limit: 1024 ** 3, max_concurrent_jobs: 2 };
const dataset = { id: "d1", name: "wiki.txt", kind: "text", size_bytes: 2048, sha256: "f".repeat(64), discoverable: false };

describe("WorkspacePage", () => {
  it("shows datasets with size, kind and hash, and flips the catalog switch", async () => {
    const fake = mockApi({
      "GET /me": member,
      "GET /workspaces/w1": ws,
      "GET /workspaces/w1/datasets": page([dataset]),
      "PATCH /datasets/d1": (c: { body: { discoverable: boolean } }) => ({ ...dataset, ...c.body }),
    });
    renderPage(<WorkspacePage />, { path: "/workspaces/w1", route: "/workspaces/:ws" });
    const user = userEvent.setup();
    const sw = await screen.findByRole("switch", { name: "Discoverable: wiki.txt" });
    expect(screen.getByText("2.00 KiB")).toBeInTheDocument();
    expect(screen.getByText("text")).toBeInTheDocument();
    expect(screen.getByRole("progressbar", { name: "Storage used" })).toHaveAttribute("aria-valuenow", "50");
    expect(sw).not.toBeChecked();
    await user.click(sw);
    await waitFor(() => expect(screen.getByRole("switch", { name: "Discoverable: wiki.txt" })).toBeChecked());
    expect(fake.find("PATCH", "/datasets/d1")[0].body).toEqual({ discoverable: true });
    expect(screen.getByText("“wiki.txt” is listed in the catalog.")).toBeInTheDocument();
  });

  it("deletes a dataset after confirmation", async () => {
    let items = [dataset];
    const fake = mockApi({
      "GET /me": member,
      "GET /workspaces/w1": ws,
      "GET /workspaces/w1/datasets": () => page(items),
      "DELETE /datasets/d1": () => {
        items = [];
        return reply(204);
      },
    });
    renderPage(<WorkspacePage />, { path: "/workspaces/w1", route: "/workspaces/:ws" });
    const user = userEvent.setup();
    await user.click(await screen.findByRole("button", { name: "Delete wiki.txt" }));
    await user.click(screen.getByRole("button", { name: "Yes, delete" }));
    expect(await screen.findByText("No datasets in this workspace yet.")).toBeInTheDocument();
    expect(fake.find("DELETE", "/datasets/d1")).toHaveLength(1);
  });

  it("uploads with a progress bar and lists the new dataset", async () => {
    class FakeXhr {
      static last: FakeXhr;
      upload: { onprogress: ((e: ProgressEvent) => void) | null } = { onprogress: null };
      onload: (() => void) | null = null;
      onerror: (() => void) | null = null;
      onabort: (() => void) | null = null;
      status = 0;
      responseText = "";
      withCredentials = false;
      sent: FormData | null = null;
      constructor() {
        FakeXhr.last = this;
      }
      open() {}
      setRequestHeader() {}
      send(body: FormData) {
        this.sent = body;
      }
      abort() {}
    }
    vi.stubGlobal("XMLHttpRequest", FakeXhr);
    let items: (typeof dataset)[] = [];
    mockApi({ "GET /me": member, "GET /workspaces/w1": ws, "GET /workspaces/w1/datasets": () => page(items) });
    renderPage(<WorkspacePage />, { path: "/workspaces/w1", route: "/workspaces/:ws" });
    const user = userEvent.setup();
    expect(await screen.findByText(/Upload a text corpus/)).toBeInTheDocument();
    await user.click(screen.getByRole("button", { name: "Upload dataset" }));
    await user.upload(screen.getByLabelText("File"), new File(["hello world"], "corpus.txt", { type: "text/plain" }));
    expect(screen.getByLabelText("Dataset name")).toHaveValue("corpus.txt");
    await user.selectOptions(screen.getByLabelText("Kind"), "parallel");
    await user.click(screen.getByLabelText(/List in the catalog/));
    await user.click(screen.getByRole("button", { name: "Upload" }));
    const xhr = FakeXhr.last;
    expect(xhr.sent?.get("name")).toBe("corpus.txt");
    expect(xhr.sent?.get("kind")).toBe("parallel");
    expect(xhr.sent?.get("discoverable")).toBe("true");
    xhr.upload.onprogress?.({ lengthComputable: true, loaded: 5, total: 10 } as ProgressEvent);
    expect(await screen.findByRole("progressbar", { name: "Upload progress" })).toHaveAttribute("aria-valuenow", "50");
    items = [{ ...dataset, id: "d2", name: "corpus.txt", kind: "parallel" }];
    xhr.status = 201;
    xhr.responseText = JSON.stringify(items[0]);
    xhr.onload?.();
    expect(await screen.findByText(/Uploaded “corpus.txt”/)).toBeInTheDocument();
    expect(await screen.findByRole("link", { name: "corpus.txt" })).toBeInTheDocument();
  });
});

describe("WorkspacesPage", () => {
  it("says what to do when there is no workspace, and creates one", async () => {
    const fake = mockApi({ "GET /me": member, "GET /workspaces": page([]), "POST /workspaces": reply(201, { ...ws, id: "w2", name: "new" }) });
    renderPage(<WorkspacesPage />, { path: "/workspaces", route: "/workspaces" });
    const user = userEvent.setup();
    expect(await screen.findByText("You have no workspace yet.")).toBeInTheDocument();
    await user.type(screen.getByLabelText("New workspace name"), "new");
    await user.click(screen.getByRole("button", { name: "Create workspace" }));
    await waitFor(() => expect(fake.find("POST", "/workspaces")[0]?.body).toEqual({ name: "new" }));
  });
});
