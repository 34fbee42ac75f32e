package keytable

import (
	"strconv"
	"strings"
)

// Stored formats and their versions. Every part of a key row whose encoding may change
// between releases says which version it is written in, so that a build can tell a row
// it cannot read (written by a newer build) from a row that is wrong:
//
//   - status: one of StatusInProgress, StatusFinished, StatusDead; any other value is a
//     newer build's.
//   - fingerprint: v1 is 32 bytes (a bare sha256); every later version starts with its
//     version byte and is never 32 bytes long (v2: 0x02 and a sha256, 33 bytes; v3:
//     0x03, 8 bytes of a member list's hash and two sha256, 73 bytes). The
//     engine (package workflow) computes and compares them.
//   - recovery point: "started", "finished" or the name of one of the flow's phases.
//   - phase data and the stored response's headers: JSON objects whose member
//     FormatMember, when present, holds the version as a JSON number; absent means 1.
//     Version 1 never writes the member, so rows written by releases that did not know
//     it read the same. Phase data format 2 (PhaseDataSealed) is format 1 on a row
//     whose request body is sealed (the engine's Sealer); response format 2 is an
//     answer whose body is sealed. Both are written only by an engine with a Sealer.
//   - history entries: JSON objects read by name; a release may add members, never
//     change the meaning of one, so they carry no version.
//
// A release that brings a new version first ships reading it while still writing the
// old one; only a later release writes it (docs/OPERATIONS.md, "Upgrades").
const (
	// FormatMember is the member of a stored JSON object (phase data, response
	// headers) that holds its format version. No HTTP header can have this name (a
	// colon is not allowed in one); phase data must not use it as a slot name.
	FormatMember = "idemflow:format"
	// PhaseDataFormat is the newest phase data format this release reads, and the one
	// it writes (without FormatMember).
	PhaseDataFormat = 1
	// ResponseFormat is the newest stored response format this release reads, and the
	// one it writes (without FormatMember).
	ResponseFormat = 1
	// PhaseDataSealed is the phase data format of an unfinished row whose request body
	// is sealed: the phase data as in format 1, with FormatMember 2. Only a Store made
	// with Options.SealedBodies takes such keys in a sweep.
	PhaseDataSealed = 2
)

// KnownStatus reports whether status is one this release knows.
func KnownStatus(status string) bool {
	switch status {
	case StatusInProgress, StatusFinished, StatusDead:
		return true
	}
	return false
}

// knownFormat is the SQL condition that an unfinished row's fingerprint and phase
// data are in formats this release reads: the sweeper takes no other. A Store made
// with Options.SealedBodies sends knownSealedFormat in its place (withSealedBodies).
var knownFormat = knownFormatOf(strconv.Itoa(PhaseDataFormat))

// knownSealedFormat is knownFormat that also reads phase data format 2 (a sealed
// request body).
var knownSealedFormat = knownFormatOf(strconv.Itoa(PhaseDataFormat), strconv.Itoa(PhaseDataSealed))

func knownFormatOf(phaseData ...string) string {
	return `((octet_length(fingerprint) = 32 OR octet_length(fingerprint) = 33 AND get_byte(fingerprint, 0) = 2
		OR octet_length(fingerprint) = 73 AND get_byte(fingerprint, 0) = 3)
	AND coalesce(phase_data ->> '` + FormatMember + `', '1') IN ('` + strings.Join(phaseData, `', '`) + `'))`
}

// withSealedBodies makes the sweeps' statements take keys whose request body is
// sealed too: the engine that uses s opens them (Options.SealedBodies).
func (s *Store) withSealedBodies() {
	for _, stmt := range []*string{&s.sql.takeDue, &s.sql.scanDue, &s.sql.takeKey} {
		*stmt = strings.ReplaceAll(*stmt, knownFormat, knownSealedFormat)
	}
}

// knownPoint is the SQL condition that a row's flow and recovery point are among the
// encoded pairs $n (see pointKeys), or that $n is NULL (any).
func knownPoint(n string) string {
	return `($` + n + `::text[] IS NULL OR octet_length(flow) || ':' || flow || recovery_point = ANY($` + n + `::text[]))`
}

// pointKeys encodes TakeDue.Points for knownPoint: each flow and recovery point as the
// flow's length in bytes, a colon, the flow and the point, so that no two pairs share
// an encoding. nil stays nil (any point).
func pointKeys(points map[string][]string) []string {
	if points == nil {
		return nil
	}
	out := []string{}
	for flow, ps := range points {
		for _, p := range ps {
			out = append(out, strconv.Itoa(len(flow))+":"+flow+p)
		}
	}
	return out
}
