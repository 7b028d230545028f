// The anchor of the admission benchmark (`make bench`, e2e/bench_admission.rs): a Go
// standard-library HTTPS server shaped like the admission service on its protected-RBAC path.
// It decodes the AdmissionReview into typed structs (the whole review, as a Go webhook built on
// k8s.io/api would), checks the envelope, exempts the same users and groups, denies the
// deletion of a protected ClusterRole or ClusterRoleBinding with the same message, and encodes
// the AdmissionReview response. TLS from the same tls.crt and tls.key, HTTP/1.1 and HTTP/2.
//
// Built by hack/bench-tools.sh with Debian's Go (golang-go); nothing beyond the standard library.
//
//	anchor <cert-dir> <port>
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

type gvk struct {
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

type gvr struct {
	Group    string `json:"group"`
	Version  string `json:"version"`
	Resource string `json:"resource"`
}

type userInfo struct {
	Username string              `json:"username"`
	UID      string              `json:"uid"`
	Groups   []string            `json:"groups"`
	Extra    map[string][]string `json:"extra"`
}

type request struct {
	UID             string          `json:"uid"`
	Kind            gvk             `json:"kind"`
	Resource        gvr             `json:"resource"`
	SubResource     string          `json:"subResource"`
	RequestKind     *gvk            `json:"requestKind"`
	RequestResource *gvr            `json:"requestResource"`
	Name            string          `json:"name"`
	Namespace       string          `json:"namespace"`
	Operation       string          `json:"operation"`
	UserInfo        userInfo        `json:"userInfo"`
	Object          json.RawMessage `json:"object"`
	OldObject       json.RawMessage `json:"oldObject"`
	DryRun          *bool           `json:"dryRun"`
	Options         json.RawMessage `json:"options"`
}

type review struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Request    *request `json:"request"`
}

type status struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type response struct {
	UID     string  `json:"uid"`
	Allowed bool    `json:"allowed"`
	Status  *status `json:"status,omitempty"`
}

type reply struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Response   response `json:"response"`
}

// The agent's defaults (src/config.rs).
var protected = []string{"cluster-admin", "admin", "edit", "view", "system:*", "dedicated-admins*"}
var exemptUsers = []string{"system:admin", "system:serviceaccount:hypershift:*", "system:serviceaccount:kube-system:*",
	"system:serviceaccount:openshift-*", "system:kube-controller-manager", "system:kube-scheduler"}
var exemptGroups = map[string]bool{"system:masters": true, "osd-sre-admins": true, "osd-sre-cluster-admins": true}

func matches(patterns []string, name string) bool {
	for _, p := range patterns {
		if strings.HasSuffix(p, "*") && strings.HasPrefix(name, strings.TrimSuffix(p, "*")) || p == name {
			return true
		}
	}
	return false
}

func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func protectedRBAC(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(strings.ToLower(ct), "application/json") {
		fail(w, http.StatusUnsupportedMediaType, "content type must be application/json")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 3<<20))
	if err != nil {
		fail(w, http.StatusBadRequest, err.Error())
		return
	}
	var rv review
	if err := json.Unmarshal(body, &rv); err != nil {
		fail(w, http.StatusBadRequest, "body is not valid JSON: "+err.Error())
		return
	}
	if rv.APIVersion != "admission.k8s.io/v1" || rv.Kind != "AdmissionReview" || rv.Request == nil || rv.Request.UID == "" {
		fail(w, http.StatusBadRequest, "not an AdmissionReview v1 request")
		return
	}
	req := rv.Request
	out := response{UID: req.UID, Allowed: true}
	exempt := matches(exemptUsers, req.UserInfo.Username)
	for _, g := range req.UserInfo.Groups {
		exempt = exempt || exemptGroups[g]
	}
	res := req.Resource.Resource
	if !exempt && req.Operation == "DELETE" && req.Resource.Group == "rbac.authorization.k8s.io" &&
		(res == "clusterroles" || res == "clusterrolebindings") && matches(protected, req.Name) {
		kind := "ClusterRoleBinding"
		if res == "clusterroles" {
			kind = "ClusterRole"
		}
		out.Allowed = false
		out.Status = &status{Code: 403, Message: fmt.Sprintf(
			"hcp-fleet: deleting the protected %s %q is not allowed on a managed cluster; ask SRE if it must go", kind, req.Name)}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(reply{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview", Response: out})
}

func main() {
	if len(os.Args) != 3 {
		log.Fatal("usage: anchor <cert-dir> <port>")
	}
	dir, port := os.Args[1], os.Args[2]
	mux := http.NewServeMux()
	mux.HandleFunc("/validate/protected-rbac", protectedRBAC)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := &http.Server{Addr: "127.0.0.1:" + port, Handler: mux}
	log.Fatal(srv.ListenAndServeTLS(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")))
}
