// With --api-key every route but the health probes needs `Authorization: Bearer KEY`, which a
// browser cannot send when it opens a page. The pages hold no data and are served without one;
// their requests go through `api`, which sends the key kept for this tab only (sessionStorage,
// not the page's address or a cookie). A refused request (401) shows a small form for the key,
// typed in a password field, and nothing asks again by itself: a dialog per refused request
// came back every second on the dashboard, and a wrong key never stopped asking.
const KEY = "queryserve-api-key";
const keyForm = document.createElement("form"), keyInput = document.createElement("input");
const keyLabel = document.createElement("label"), keyButton = document.createElement("button");
keyForm.id = "api-key"; keyForm.hidden = true;
keyInput.type = "password"; keyInput.autocomplete = "off"; keyButton.textContent = "Use key";
keyLabel.append(document.createElement("span"), " ", keyInput);
keyForm.append(keyLabel, " ", keyButton);
document.body.prepend(keyForm);
let keyWanted = false;  // a request was refused: no key, or a wrong one, until one is given
let onKey = () => {};  // the page's: what to do again once a key is given
function askForKey(refused) {
  keyWanted = true;
  keyLabel.firstChild.textContent = refused ? "The server refused this API key. Its API key:"
                                            : "This server needs its API key (--api-key):";
  keyForm.hidden = false;
}
keyForm.addEventListener("submit", event => {
  event.preventDefault();  // never a navigation, which would put the key in the address
  if (!keyInput.value.trim()) return;
  sessionStorage.setItem(KEY, keyInput.value.trim());
  keyInput.value = ""; keyForm.hidden = true; keyWanted = false;
  onKey();
});
async function api(path, init = {}) {
  const key = sessionStorage.getItem(KEY);
  const response = await fetch(path, key === null ? init
    : {...init, headers: {...init.headers, Authorization: `Bearer ${key}`}});
  // Refused with the key still current (not one given meanwhile, for another request).
  if (response.status === 401 && sessionStorage.getItem(KEY) === key) askForKey(key !== null);
  return response;
}
// What a refused request says on the page (the server's own 401 text is for curl users).
const keyMessage = () => sessionStorage.getItem(KEY) === null
  ? "This server needs an API key: enter it above."
  : "The server refused the API key: enter the right one above.";
