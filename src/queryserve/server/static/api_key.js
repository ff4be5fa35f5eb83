// With --api-key every route but the health probes needs `Authorization: Bearer KEY`, which a
// browser cannot send when it opens a page. The pages hold no data and are served without one;
// their requests go through `api`, which asks for the key the first time one is refused (401)
// and keeps it for this tab only (sessionStorage), not in the page's address or a cookie.
const KEY = "queryserve-api-key";
let keyDeclined = false;
async function api(path, init = {}) {
  for (let attempt = 0; ; attempt++) {
    const key = sessionStorage.getItem(KEY);
    const response = await fetch(path, key === null ? init
      : {...init, headers: {...init.headers, Authorization: `Bearer ${key}`}});
    if (response.status !== 401 || keyDeclined || attempt === 3) return response;
    if (sessionStorage.getItem(KEY) !== key) continue;  // given meanwhile, for another request
    const given = prompt(key === null ? "This server needs its API key (--api-key):"
                                      : "That API key was refused. The server's API key:");
    if (!given) { keyDeclined = true; return response; }
    sessionStorage.setItem(KEY, given.trim());
  }
}
