// Starts GraphiQL from the gateway's own copies of its files (no other host).
// The configuration (endpoint and example operations) is a JSON block in the
// page; a token in the address's fragment (#token=...) goes into the headers
// pane and is then removed from the address bar. Fragments are never sent to
// a server, so the token stays out of access logs.
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("recall-graphiql-config").textContent);
  var fragment = new URLSearchParams(window.location.hash.slice(1));
  var token = fragment.get("token");
  if (token !== null) {
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  var headers = JSON.stringify(
    { Authorization: "Bearer " + (token || "<paste a token here>") },
    null,
    2
  );
  var tabs = config.examples.map(function (example) {
    return { query: example.query, variables: example.variables, headers: headers };
  });
  var root = ReactDOM.createRoot(document.getElementById("graphiql"));
  root.render(
    React.createElement(GraphiQL, {
      fetcher: GraphiQL.createFetcher({ url: config.endpoint }),
      defaultTabs: tabs,
      // GraphiQL 3 fills the editors from these, not from the first tab's variables.
      query: tabs[0].query,
      variables: tabs[0].variables,
      defaultHeaders: headers,
      defaultEditorToolsVisibility: "headers",
      // Tabs live for this browser tab only; the token is never written to storage.
      storage: window.sessionStorage,
      shouldPersistHeaders: false,
    })
  );
})();
